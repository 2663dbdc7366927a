package selection

import (
	"math"
	"strconv"
)

// Bounds on what one registration may carry. The catalog is written by
// API clients, so every field a client controls has a size bound, checked
// on the merged record before anything is derived from it (its ranks,
// listeners, taints). A record past a bound is refused whole with 422.
const (
	// DefaultMaxRanksPerWorker is Config.MaxRanksPerWorker's default and
	// the bound a zero MaxRanksPerWorker stands for.
	DefaultMaxRanksPerWorker = 256
	// MaxFieldBytes bounds the name-like strings of a registration
	// (model_name, routing_group, tenant_id, stable_routing_id,
	// kv_transfer_domain, kv_transfer_enforcement, router_hint_worker_type),
	// each taint, and the keys and values of topology_domains. Model names
	// and labels are short; 256 bytes is what Dynamo allows a session id.
	MaxFieldBytes = 256
	// MaxEndpointBytes bounds every endpoint (endpoint, kv_events_endpoint,
	// each kv_events_endpoints value, replay_endpoint, each
	// router_hint_source_control_endpoints value): 2,048 bytes is the URL
	// length browsers and proxies have long accepted, and room for any
	// host name (253 bytes), port and path.
	MaxEndpointBytes = 2048
	// MaxTaints bounds the taints of one worker. Every candidate's taints
	// are matched on every selection with routing constraints, so they
	// must stay a handful; 64 leaves room for any labelling scheme.
	MaxTaints = 64
	// MaxMapEntries bounds topology_domains and
	// router_hint_source_control_endpoints, for the same reason as
	// MaxTaints (topology labels become taints).
	MaxMapEntries = 64
	// MaxContextTokens bounds max_model_len and max_num_batched_tokens:
	// 2^26 (some 67 million tokens) is past any context an engine runs
	// today (10 million at most). Figures are multiplied by what a token
	// costs elsewhere, and one of 2^61 read from an engine made the
	// /tokenize answer's bound negative, so that every prompt of its model
	// was refused as too long.
	MaxContextTokens = 1 << 26
	// MaxKVBlocks bounds total_kv_blocks: 2^32 blocks of 16 tokens is a
	// cache of 68 billion tokens, past any device's.
	MaxKVBlocks = 1 << 32
)

// maxRanksPerWorker is the effective per-worker rank bound.
func (c *Config) maxRanksPerWorker() int {
	if c.MaxRanksPerWorker > 0 {
		return c.MaxRanksPerWorker
	}
	return DefaultMaxRanksPerWorker
}

// checkBounds refuses a request field that is not kept in the record
// (tenant_id, read only when routing_group is absent).
func (req *WorkerRequest) checkBounds() error {
	if req.TenantID != nil && len(*req.TenantID) > MaxFieldBytes {
		return tooLong("tenant_id", len(*req.TenantID), MaxFieldBytes)
	}
	// An engine runs with some block size: 0 would make the worker
	// load-only for nothing, or be taken as its block size.
	if req.EngineBlockSize != nil && *req.EngineBlockSize == 0 {
		return errorf(KindUnprocessable, "engine_block_size must be at least 1")
	}
	return nil
}

// checkBounds refuses a record with a field past its bound. It must run
// before validate, which lists the record's ranks.
func (w *WorkerRecord) checkBounds(cfg *Config) error {
	if limit := cfg.maxRanksPerWorker(); uint64(w.DataParallelSize) > uint64(limit) {
		return errorf(KindUnprocessable, "data_parallel_size %d exceeds the bound of %d ranks per worker (max_ranks_per_worker)",
			w.DataParallelSize, limit)
	}
	for _, f := range []struct {
		name  string
		v     *uint64
		limit uint64
	}{
		{"max_model_len", w.MaxModelLen, MaxContextTokens},
		{"max_num_batched_tokens", w.MaxNumBatchedTokens, MaxContextTokens},
		{"total_kv_blocks", w.TotalKVBlocks, MaxKVBlocks},
	} {
		if f.v != nil && *f.v > f.limit {
			return errorf(KindUnprocessable, "%s %d exceeds the bound of %d", f.name, *f.v, f.limit)
		}
	}
	if uint64(w.DataParallelStartRank)+uint64(w.DataParallelSize) > math.MaxUint32 {
		return errorf(KindUnprocessable, "data_parallel_start_rank %d + data_parallel_size %d overflows a u32 rank",
			w.DataParallelStartRank, w.DataParallelSize)
	}
	for _, f := range []struct {
		name  string
		v     *string
		limit int
	}{
		{"model_name", &w.ModelName, MaxFieldBytes},
		{"routing_group", &w.RoutingGroup, MaxFieldBytes},
		{"stable_routing_id", w.StableRoutingID, MaxFieldBytes},
		{"kv_transfer_domain", w.KVTransferDomain, MaxFieldBytes},
		{"kv_transfer_enforcement", w.KVTransferEnforcement, MaxFieldBytes},
		{"router_hint_worker_type", w.RouterHintWorkerType, MaxFieldBytes},
		{"endpoint", w.Endpoint, MaxEndpointBytes},
		{"kv_events_endpoint", w.KVEventsEndpoint, MaxEndpointBytes},
		{"replay_endpoint", w.ReplayEndpoint, MaxEndpointBytes},
	} {
		if f.v != nil && len(*f.v) > f.limit {
			return tooLong(f.name, len(*f.v), f.limit)
		}
	}
	if len(w.Taints) > MaxTaints {
		return errorf(KindUnprocessable, "taints has %d entries, more than the bound of %d", len(w.Taints), MaxTaints)
	}
	for i, t := range w.Taints {
		if len(t) > MaxFieldBytes {
			return tooLong("taints["+strconv.Itoa(i)+"]", len(t), MaxFieldBytes)
		}
	}
	if err := checkMap("topology_domains", w.TopologyDomains, MaxMapEntries, MaxFieldBytes); err != nil {
		return err
	}
	if err := checkMap("router_hint_source_control_endpoints", w.RouterHintSourceControl, MaxMapEntries, MaxEndpointBytes); err != nil {
		return err
	}
	return w.checkEventEndpoints()
}

// checkEventEndpoints allows one kv_events_endpoints entry per rank of the
// worker, each keyed by the rank in decimal: a key that is not a rank
// would never be read, and an unbounded map would be.
func (w *WorkerRecord) checkEventEndpoints() error {
	if uint64(len(w.KVEventsEndpoints)) > uint64(w.DataParallelSize) {
		return errorf(KindUnprocessable, "kv_events_endpoints has %d entries, more than data_parallel_size %d",
			len(w.KVEventsEndpoints), w.DataParallelSize)
	}
	for k, v := range w.KVEventsEndpoints {
		if len(k) > MaxFieldBytes {
			return tooLong("a kv_events_endpoints key", len(k), MaxFieldBytes)
		}
		rank, err := strconv.ParseUint(k, 10, 32)
		if err != nil || strconv.FormatUint(rank, 10) != k ||
			rank < uint64(w.DataParallelStartRank) || rank >= uint64(w.DataParallelStartRank)+uint64(w.DataParallelSize) {
			return errorf(KindUnprocessable, "kv_events_endpoints key %q is not a dp_rank of the worker (%d to %d)",
				k, w.DataParallelStartRank, uint64(w.DataParallelStartRank)+uint64(w.DataParallelSize)-1)
		}
		if len(v) > MaxEndpointBytes {
			return tooLong("kv_events_endpoints["+k+"]", len(v), MaxEndpointBytes)
		}
	}
	return nil
}

func checkMap(name string, m map[string]string, entries, valueBytes int) error {
	if len(m) > entries {
		return errorf(KindUnprocessable, "%s has %d entries, more than the bound of %d", name, len(m), entries)
	}
	for k, v := range m {
		if len(k) > MaxFieldBytes {
			return tooLong("a "+name+" key", len(k), MaxFieldBytes)
		}
		if len(v) > valueBytes {
			return tooLong(name+" value", len(v), valueBytes)
		}
	}
	return nil
}

func tooLong(name string, n, limit int) error {
	return errorf(KindUnprocessable, "%s is %d bytes, more than the bound of %d", name, n, limit)
}

// checkPartition refuses a request's model name or routing group longer
// than any a worker can be registered under: it could match nothing, and
// the 503 that says so would echo it (the proxy takes the group from a
// request header).
func checkPartition(k PartitionKey) error {
	if len(k.Model) > MaxFieldBytes {
		return errorf(KindBadRequest, "model_name must be at most %d bytes", MaxFieldBytes)
	}
	if len(k.Group) > MaxFieldBytes {
		return errorf(KindBadRequest, "routing_group must be at most %d bytes", MaxFieldBytes)
	}
	return nil
}
