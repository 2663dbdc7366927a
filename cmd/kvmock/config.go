package main

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/kvrouter/caddy-kvrouter/indexer"
)

// Config describes a fleet of simulated workers. The zero value of a base
// port means "any free port" for every worker, which lets tests run fleets
// side by side without choosing ports.
type Config struct {
	// Workers is the number of simulated vLLM processes; their ids are 1..Workers.
	Workers int
	// DPRanks is the number of data-parallel ranks (engine cores) per
	// worker. Each rank has its own KV cache, scheduler and publisher.
	DPRanks int

	// HTTPBasePort is the port of worker 0's API; worker i serves on base+i.
	HTTPBasePort int
	// ZMQBasePort is the port of the first KV-event PUB socket; rank r of
	// worker i binds base + i*DPRanks + r, as vLLM offsets ports per DP rank.
	ZMQBasePort int
	// ReplayBasePort numbers the replay ROUTER sockets like ZMQBasePort.
	ReplayBasePort int
	// Admin is the fleet admin listener ("host:port"); empty means none.
	Admin string
	// Register, when set, is the gateway's selection API base URL to which
	// every worker is POSTed on start.
	Register string
	// RegisterToken is the bearer token the registrations carry, for a
	// gateway whose kv_selection has a write_token; empty sends none.
	RegisterToken string

	// BlockSize is the number of tokens per KV block.
	BlockSize int
	// KVBlocks is the KV-cache capacity of each rank, in blocks.
	KVBlocks int
	// Encoding is the event encoding of the published payloads.
	Encoding indexer.Encoding
	// KVCacheGroups, when set, are the kinds of a hybrid model's KV-cache
	// groups, by group_idx, as vLLM's hybrid cache manager publishes
	// them: every store and removal goes out once per group, tagged with
	// its group_idx (and a store with its kv_cache_spec_kind). The cache
	// itself stays one: kvmock models the full-attention group's hits.
	KVCacheGroups []string
	// Model is the served model name.
	Model string
	// PrefillRate is how many uncached prompt tokens a rank computes per second.
	PrefillRate float64
	// DecodeTime is the duration of a step that samples output tokens.
	DecodeTime time.Duration
	// MaxBatchedTokens is the token budget of one scheduler step.
	MaxBatchedTokens int
	// MaxNumSeqs caps the requests running at once on a rank.
	MaxNumSeqs int
	// MaxTokens is the number of output tokens of a request that names none.
	MaxTokens int
	// MaxModelLen bounds prompt plus output tokens, as vLLM's max_model_len.
	MaxModelLen int
	// MaxModelLenOf gives some workers (by id) a context of their own.
	MaxModelLenOf map[int]int
	// ReplayBuffer is the number of batches each publisher keeps for replay.
	ReplayBuffer int

	// LoraModules are the LoRA adapters the workers of LoraWorkers load
	// (vLLM's --lora-modules).
	LoraModules []LoraModule
	// LoraWorkers are the ids of the workers that load LoraModules; empty
	// means every worker.
	LoraWorkers []int
	// EnablePromptTokensDetails makes usage report
	// prompt_tokens_details.cached_tokens, as vLLM's
	// --enable-prompt-tokens-details does; off, as in vLLM, usage has no
	// cached tokens at all.
	EnablePromptTokensDetails bool
	// EnableForceIncludeUsage ends every stream with a usage chunk, as
	// vLLM's --enable-force-include-usage does; off, only a request with
	// stream_options.include_usage gets one.
	EnableForceIncludeUsage bool
	// TokenizeSkew makes /tokenize disagree with what the completion
	// routes prefill, on purpose, so that a gateway's test can prove it
	// notices (tokenize.go).
	TokenizeSkew TokenizeSkew
	// API is the request API the workers follow: APIVLLM, or APISGLang
	// for SGLang's adapter and cache-namespace members (sglang.go). The
	// KV events keep the --event-encoding form either way.
	API string
}

// The request APIs of Config.API.
const (
	APIVLLM   = "vllm"
	APISGLang = "sglang"
)

// DefaultConfig returns the settings of the command-line defaults. The
// prefill rate is low enough that a long uncached prompt costs a visible
// fraction of a second, so routing to a cached prefix shows in latencies.
func DefaultConfig() Config {
	return Config{
		Workers:          8,
		DPRanks:          1,
		HTTPBasePort:     8001,
		ZMQBasePort:      5557,
		ReplayBasePort:   5657,
		Admin:            "127.0.0.1:8000",
		BlockSize:        16,
		KVBlocks:         4096,
		Encoding:         indexer.EncodingMap,
		Model:            "default",
		PrefillRate:      20000,
		DecodeTime:       5 * time.Millisecond,
		MaxBatchedTokens: 8192,
		MaxNumSeqs:       256,
		MaxTokens:        16,
		MaxModelLen:      131072,
		ReplayBuffer:     10_000,
		TokenizeSkew:     SkewNone,
		API:              APIVLLM,
	}
}

// portRange is a block of consecutive ports one kind of socket uses.
type portRange struct {
	name       string
	first, end int // [first, end)
}

// Validate reports settings that cannot work, including port ranges that
// overlap: with many workers the default bases collide (5557+N reaches
// 5657), and a clear error beats a bind failure halfway through start.
func (c *Config) Validate() error {
	switch {
	case c.Workers < 1:
		return errors.New("--workers must be at least 1")
	case c.DPRanks < 1:
		return errors.New("--dp-ranks must be at least 1")
	case c.BlockSize < 1:
		return errors.New("--block-size must be at least 1")
	case c.KVBlocks < 1:
		return errors.New("--kv-blocks must be at least 1")
	case c.PrefillRate <= 0:
		return errors.New("--prefill-rate must be positive")
	case c.DecodeTime < 0:
		return errors.New("--decode-ms must not be negative")
	case c.MaxBatchedTokens < 1:
		return errors.New("--max-num-batched-tokens must be at least 1")
	case c.MaxNumSeqs < 1:
		return errors.New("--max-num-seqs must be at least 1")
	case c.MaxTokens < 1:
		return errors.New("--max-tokens must be at least 1")
	case c.MaxModelLen < 2:
		return errors.New("--max-model-len must be at least 2")
	case c.ReplayBuffer < 1:
		return errors.New("--replay-buffer must be at least 1")
	case c.Model == "":
		return errors.New("--model must not be empty")
	case c.API != APIVLLM && c.API != APISGLang:
		return errors.New("--api must be vllm or sglang")
	}
	if err := c.TokenizeSkew.validate(); err != nil {
		return err
	}
	if err := c.validateLora(); err != nil {
		return err
	}
	if err := c.validateContexts(); err != nil {
		return err
	}
	ranks := c.Workers * c.DPRanks
	var ranges []portRange
	add := func(name string, base, n int) {
		if base != 0 {
			ranges = append(ranges, portRange{name, base, base + n})
		}
	}
	add("--http-base-port", c.HTTPBasePort, c.Workers)
	add("--zmq-base-port", c.ZMQBasePort, ranks)
	add("--replay-base-port", c.ReplayBasePort, ranks)
	if c.Admin != "" {
		host, p, err := net.SplitHostPort(c.Admin)
		if err != nil {
			return fmt.Errorf("--admin: %v", err)
		}
		// The admin API can stop workers and has no authentication.
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return fmt.Errorf("--admin must be a loopback address, not %q", host)
		}
		port, err := strconv.Atoi(p)
		if err != nil {
			return fmt.Errorf("--admin: bad port %q", p)
		}
		add("--admin", port, 1)
	}
	for i, a := range ranges {
		if a.first < 1 || a.end-1 > 65535 {
			return fmt.Errorf("%s: ports %d-%d are out of range", a.name, a.first, a.end-1)
		}
		for _, b := range ranges[i+1:] {
			if a.first < b.end && b.first < a.end {
				return fmt.Errorf("%s (%d-%d) overlaps %s (%d-%d); move one of the bases",
					a.name, a.first, a.end-1, b.name, b.first, b.end-1)
			}
		}
	}
	return nil
}

// httpAddr is worker i's API listen address.
func (c *Config) httpAddr(i int) string {
	return "127.0.0.1:" + strconv.Itoa(portOf(c.HTTPBasePort, i))
}

// zmqEndpoint is the bind endpoint of one rank's socket under base; "*"
// asks libzmq for a free port.
func (c *Config) zmqEndpoint(base, worker, rank int) string {
	if base == 0 {
		return "tcp://127.0.0.1:*"
	}
	return "tcp://127.0.0.1:" + strconv.Itoa(base+worker*c.DPRanks+rank)
}

// portOf is the i-th port from base, or 0 (any port) when base is 0.
func portOf(base, i int) int {
	if base == 0 {
		return 0
	}
	return base + i
}
