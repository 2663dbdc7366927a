// Command kvmock simulates a fleet of vLLM workers in one process, for
// demos and benchmarks of the caddy-kvrouter gateway. Each worker serves
// vLLM's OpenAI-compatible HTTP API on 127.0.0.1, keeps a paged KV cache
// with prefix caching, and publishes KV-cache events over ZMQ in vLLM's wire
// format (PUB socket plus replay ROUTER). A scheduler per engine models
// chunked prefill and decode steps in real time, so a request whose prefix
// is cached gets its first token sooner, which is what a KV-aware router is
// for. Prompts are tokenized as vLLM serving a Llama 3 model would: special
// tokens, a Llama-3.1-style chat template that writes the BOS and renders
// tools and documents (tokenizer.go, chattemplate.go), vLLM's defaults per
// route and its /tokenize; LoRA adapters, usage and /metrics follow vLLM's
// flags and shapes. --tokenize-skew makes /tokenize disagree on purpose. A
// fleet admin API resets caches, restarts or stops workers and loses
// events on purpose.
//
//	kvmock --workers 8 --register http://127.0.0.1:8092
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kvrouter/caddy-kvrouter/indexer"
)

// main parses the flags and runs the fleet until a signal.
func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetPrefix("kvmock: ")
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvmock:", err)
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

// parseFlags turns the command line into a Config.
func parseFlags(args []string) (Config, error) {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("kvmock", flag.ContinueOnError)
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "number of simulated workers (ids 1..N)")
	fs.IntVar(&cfg.DPRanks, "dp-ranks", cfg.DPRanks, "data-parallel ranks per worker, each with its own cache and publisher")
	fs.IntVar(&cfg.HTTPBasePort, "http-base-port", cfg.HTTPBasePort, "worker i serves HTTP on 127.0.0.1:base+i (0: any free port)")
	fs.IntVar(&cfg.ZMQBasePort, "zmq-base-port", cfg.ZMQBasePort, "rank r of worker i binds its KV-event PUB on base+i*dp_ranks+r (0: any)")
	fs.IntVar(&cfg.ReplayBasePort, "replay-base-port", cfg.ReplayBasePort, "replay ROUTER ports, numbered like --zmq-base-port (0: any)")
	fs.StringVar(&cfg.Admin, "admin", cfg.Admin, "fleet admin listen address (empty: none)")
	fs.StringVar(&cfg.Register, "register", "", "selection API base URL to POST each worker to on start, e.g. http://127.0.0.1:8092")
	fs.StringVar(&cfg.RegisterToken, "register-token", os.Getenv("KVROUTER_WRITE_TOKEN"),
		"bearer token for --register, for a gateway with kv_selection's write_token (default: $KVROUTER_WRITE_TOKEN)")
	fs.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "tokens per KV block")
	fs.IntVar(&cfg.KVBlocks, "kv-blocks", cfg.KVBlocks, "KV-cache capacity per rank, in blocks")
	encoding := fs.String("event-encoding", "map", "KV-event encoding: map (vLLM from mid-2026) or array (positional, older vLLM)")
	fs.StringVar(&cfg.Model, "model", cfg.Model, "served model name")
	fs.Float64Var(&cfg.PrefillRate, "prefill-rate", cfg.PrefillRate, "uncached prompt tokens computed per second")
	decodeMS := fs.Float64("decode-ms", float64(cfg.DecodeTime)/float64(time.Millisecond), "duration of a step that samples output tokens, in ms")
	fs.IntVar(&cfg.MaxBatchedTokens, "max-num-batched-tokens", cfg.MaxBatchedTokens, "token budget of one scheduler step")
	fs.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", cfg.MaxNumSeqs, "requests running at once per rank")
	fs.IntVar(&cfg.MaxTokens, "max-tokens", cfg.MaxTokens, "output tokens of a request that does not set max_tokens")
	fs.IntVar(&cfg.MaxModelLen, "max-model-len", cfg.MaxModelLen, "maximum prompt plus output tokens")
	contexts := fs.String("max-model-len-of", "", "workers with a context of their own: id=tokens pairs separated by commas (e.g. 1=4096,2=65536)")
	fs.IntVar(&cfg.ReplayBuffer, "replay-buffer", cfg.ReplayBuffer, "batches each publisher keeps for replay")
	loraModules := fs.String("lora-modules", "",
		"LoRA adapters as name=path, separated by commas (vLLM's syntax); a request whose model names one is served only by a worker that loaded it")
	loraWorkers := fs.String("lora-workers", "", "ids of the workers that load --lora-modules, separated by commas (default: all)")
	fs.BoolVar(&cfg.EnablePromptTokensDetails, "enable-prompt-tokens-details", false,
		"report usage.prompt_tokens_details.cached_tokens (when non-zero), as vLLM's flag of that name; off, usage has no cached tokens")
	fs.BoolVar(&cfg.EnableForceIncludeUsage, "enable-force-include-usage", false,
		"end every stream with a usage chunk, as vLLM's flag of that name; off, only requests with stream_options.include_usage get one")
	fs.StringVar(&cfg.API, "api", cfg.API,
		"request API: vllm, or sglang (SGLang's lora_path, <model>:<adapter> and extra_key; the events keep --event-encoding's form)")
	groups := fs.String("kv-cache-groups", "",
		"a hybrid model's KV-cache groups by group_idx, as kinds separated by commas (e.g. sliding_window,full_attention, as gpt-oss): each KV event goes out once per group; empty: one group, as a model of full attention alone")
	skew := fs.String("tokenize-skew", string(SkewNone),
		"make /tokenize disagree with what the completion routes prefill, for testing a gateway: none; bos (a chat answer lacks the BOS token the template writes); template (chat is rendered without the tools)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	cfg.TokenizeSkew = TokenizeSkew(*skew)
	if *groups != "" {
		cfg.KVCacheGroups = strings.Split(*groups, ",")
	}
	var err error
	if cfg.LoraModules, err = parseLoraModules(*loraModules); err != nil {
		return cfg, err
	}
	if cfg.LoraWorkers, err = parseWorkerIDs(*loraWorkers); err != nil {
		return cfg, err
	}
	if cfg.MaxModelLenOf, err = parseContexts(*contexts); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	switch *encoding {
	case "map":
		cfg.Encoding = indexer.EncodingMap
	case "array":
		cfg.Encoding = indexer.EncodingArray
	default:
		return cfg, fmt.Errorf("--event-encoding must be map or array, not %q", *encoding)
	}
	cfg.DecodeTime = time.Duration(*decodeMS * float64(time.Millisecond))
	return cfg, cfg.Validate()
}

// run starts the fleet, registers it if asked, and waits for SIGINT or
// SIGTERM.
func run(cfg Config) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	f, err := NewFleet(cfg)
	if err != nil {
		return err
	}
	defer f.Close()
	first, last := f.workers[0], f.workers[len(f.workers)-1]
	log.Printf("%d workers (model %q, %d DP rank(s) each): HTTP %s … %s, KV events %s …, replay %s …, admin %s",
		len(f.workers), cfg.Model, cfg.DPRanks, first.addr, last.addr,
		first.engines[0].pub.PubEndpoint, first.engines[0].pub.ReplayEndpoint, f.AdminAddr())
	if cfg.Register != "" {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := f.Register(rctx, cfg.Register, cfg.RegisterToken)
		cancel()
		if err != nil {
			return err
		}
		log.Printf("registered %d workers at %s/workers", len(f.workers), cfg.Register)
	}
	<-ctx.Done()
	log.Print("stopping")
	return nil
}
