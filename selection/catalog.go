package selection

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// PartitionKey identifies a partition: the workers of one model and routing
// group. Each partition has one block size, one Eagle setting, its own
// overlap lookups and its own load accounting.
type PartitionKey struct {
	Model string
	Group string
}

func (k PartitionKey) withDefaults() PartitionKey {
	if k.Model == "" {
		k.Model = "default"
	}
	if k.Group == "" {
		k.Group = "default"
	}
	return k
}

func (k PartitionKey) String() string { return k.Model + ":" + k.Group }

// Rank is the schedulable unit: one data-parallel rank of a worker.
type Rank struct {
	WorkerID uint64
	DPRank   uint32
}

// Lifecycle states of a catalog worker.
const (
	LifecycleIncomplete    = "incomplete"
	LifecycleSchedulable   = "schedulable"
	LifecycleDraining      = "draining"
	LifecycleUnschedulable = "unschedulable"
)

// WorkerRequest is the body of POST /workers (upsert) and PATCH
// /workers/{id} (only the fields present are changed); docs/selection-api.md, "Workers".
type WorkerRequest struct {
	WorkerID                  *uint64           `json:"worker_id,omitempty"`
	ModelName                 *string           `json:"model_name,omitempty"`
	RoutingGroup              *string           `json:"routing_group,omitempty"`
	TenantID                  *string           `json:"tenant_id,omitempty"`
	Endpoint                  *string           `json:"endpoint,omitempty"`
	KVEventsEndpoint          *string           `json:"kv_events_endpoint,omitempty"`
	KVEventsEndpoints         map[string]string `json:"kv_events_endpoints,omitempty"`
	ReplayEndpoint            *string           `json:"replay_endpoint,omitempty"`
	BlockSize                 *uint32           `json:"block_size,omitempty"`
	DataParallelStartRank     *uint32           `json:"data_parallel_start_rank,omitempty"`
	DataParallelSize          *uint32           `json:"data_parallel_size,omitempty"`
	MaxNumBatchedTokens       *uint64           `json:"max_num_batched_tokens,omitempty"`
	TotalKVBlocks             *uint64           `json:"total_kv_blocks,omitempty"`
	StableRoutingID           *string           `json:"stable_routing_id,omitempty"`
	IsEagle                   *bool             `json:"is_eagle,omitempty"`
	Taints                    []string          `json:"taints,omitempty"`
	TopologyDomains           map[string]string `json:"topology_domains,omitempty"`
	KVTransferDomain          *string           `json:"kv_transfer_domain,omitempty"`
	KVTransferEnforcement     *string           `json:"kv_transfer_enforcement,omitempty"`
	KVTransferPreferredWeight *float32          `json:"kv_transfer_preferred_weight,omitempty"`
	RouterHintWorkerType      *string           `json:"router_hint_worker_type,omitempty"`
	RouterHintSourceControl   map[string]string `json:"router_hint_source_control_endpoints,omitempty"`
	// Our extensions (docs/engine-facts.md): what the worker's engine
	// serves and runs with. The gateway reads them from the engine too;
	// a value given here is the registration's own and wins over it.
	LoraAdapters    []string `json:"lora_adapters,omitempty"`
	MaxModelLen     *uint64  `json:"max_model_len,omitempty"`
	EngineBlockSize *uint32  `json:"engine_block_size,omitempty"`
}

// WorkerRecord is a catalog entry as the API returns it, in the shape
// Dynamo's record has: an optional field it always writes is null when
// unset, and the lists and maps it leaves out when empty are left out
// (docs/selection-api.md, "Workers").
type WorkerRecord struct {
	WorkerID                  uint64            `json:"worker_id"`
	ModelName                 string            `json:"model_name"`
	RoutingGroup              string            `json:"routing_group"`
	Endpoint                  *string           `json:"endpoint"`
	KVEventsEndpoint          *string           `json:"kv_events_endpoint"`
	KVEventsEndpoints         map[string]string `json:"kv_events_endpoints,omitempty"`
	ReplayEndpoint            *string           `json:"replay_endpoint"`
	BlockSize                 *uint32           `json:"block_size"`
	DataParallelStartRank     uint32            `json:"data_parallel_start_rank"`
	DataParallelSize          uint32            `json:"data_parallel_size"`
	MaxNumBatchedTokens       *uint64           `json:"max_num_batched_tokens"`
	TotalKVBlocks             *uint64           `json:"total_kv_blocks"`
	StableRoutingID           *string           `json:"stable_routing_id"`
	IsEagle                   *bool             `json:"is_eagle"`
	Taints                    []string          `json:"taints"`
	TopologyDomains           map[string]string `json:"topology_domains"`
	KVTransferDomain          *string           `json:"kv_transfer_domain"`
	KVTransferEnforcement     *string           `json:"kv_transfer_enforcement"`
	KVTransferPreferredWeight *float32          `json:"kv_transfer_preferred_weight"`
	RouterHintWorkerType      *string           `json:"router_hint_worker_type,omitempty"`
	RouterHintSourceControl   map[string]string `json:"router_hint_source_control_endpoints,omitempty"`
	Lifecycle                 string            `json:"lifecycle"`
	NotSchedulableReasons     []string          `json:"not_schedulable_reasons,omitempty"`
	// LoraAdapters are the LoRA adapters the worker serves: a request
	// naming one goes to this worker's partition, and only to workers
	// that serve it (docs/engine-facts.md).
	LoraAdapters []string `json:"lora_adapters,omitempty"`
	// MaxModelLen is the engine's context length, in tokens (0: unknown).
	MaxModelLen *uint64 `json:"max_model_len,omitempty"`
	// EngineBlockSize is the block size the engine reports running with.
	EngineBlockSize *uint32 `json:"engine_block_size,omitempty"`
	// EnginePrefixCaching is whether the engine reports caching prompt
	// prefixes; a worker whose engine does not is routed by load only.
	EnginePrefixCaching *bool `json:"engine_prefix_caching,omitempty"`
	// LoadOnlyReasons say why a schedulable worker is routed by load
	// only, its cached prefixes not credited (an engine block size that
	// is not the worker's block_size); empty when it is routed by cache.
	LoadOnlyReasons []string `json:"load_only_reasons,omitempty"`

	// given is what the registration gave of the fields an engine also
	// reports; the engine's report fills in only the others.
	given factFields
}

// Partition returns the record's partition key.
func (w *WorkerRecord) Partition() PartitionKey {
	return PartitionKey{Model: w.ModelName, Group: w.RoutingGroup}.withDefaults()
}

// Ranks lists the record's global data-parallel ranks. It allocates one
// entry per rank: the catalog's records are bounded by MaxRanksPerWorker,
// a record from elsewhere must be checked before.
func (w *WorkerRecord) Ranks() []Rank {
	out := make([]Rank, 0, w.DataParallelSize)
	for i := uint32(0); i < w.DataParallelSize; i++ {
		out = append(out, Rank{WorkerID: w.WorkerID, DPRank: w.DataParallelStartRank + i})
	}
	return out
}

// EventEndpoint returns the KV-events endpoint of one global rank, or "".
// Per-rank endpoints win; the single endpoint serves only a one-rank worker.
func (w *WorkerRecord) EventEndpoint(dpRank uint32) string {
	if ep, ok := w.KVEventsEndpoints[strconv.FormatUint(uint64(dpRank), 10)]; ok {
		return ep
	}
	if w.KVEventsEndpoint != nil && w.DataParallelSize == 1 {
		return *w.KVEventsEndpoint
	}
	return ""
}

// ReplayFor returns the replay endpoint listeners may use: the record's,
// for a one-rank worker only (the per-rank mapping is ambiguous otherwise).
func (w *WorkerRecord) ReplayFor() string {
	if w.ReplayEndpoint == nil || w.DataParallelSize != 1 {
		return ""
	}
	return *w.ReplayEndpoint
}

// HostPort strips a scheme and a trailing slash from an endpoint, leaving
// the host:port that upstreams dial and health probes connect to.
func HostPort(endpoint string) string {
	if i := strings.Index(endpoint, "://"); i >= 0 {
		endpoint = endpoint[i+3:]
	}
	return strings.TrimSuffix(endpoint, "/")
}

// Schedulable reports whether the record can receive traffic.
func (w *WorkerRecord) Schedulable() bool { return w.Lifecycle == LifecycleSchedulable }

func (w *WorkerRecord) clone() WorkerRecord {
	c := *w
	c.KVEventsEndpoints = maps.Clone(w.KVEventsEndpoints)
	c.Taints = slices.Clone(w.Taints)
	c.TopologyDomains = maps.Clone(w.TopologyDomains)
	c.RouterHintSourceControl = maps.Clone(w.RouterHintSourceControl)
	c.NotSchedulableReasons = slices.Clone(w.NotSchedulableReasons)
	c.LoraAdapters = slices.Clone(w.LoraAdapters)
	c.LoadOnlyReasons = slices.Clone(w.LoadOnlyReasons)
	return c
}

// effectiveTaints are the worker's taints plus its topology labels and
// one taint per LoRA adapter it serves (AdapterTaint), which an adapter's
// requests require.
func (w *WorkerRecord) effectiveTaints() []string {
	out := slices.Clone(w.Taints)
	keys := slices.Sorted(maps.Keys(w.TopologyDomains))
	for _, k := range keys {
		out = append(out, "dynamo.topology/"+k+"="+w.TopologyDomains[k])
	}
	for _, a := range w.LoraAdapters {
		out = append(out, AdapterTaint(a))
	}
	return out
}

// applyRequest merges the fields present in req into w.
func (w *WorkerRecord) applyRequest(req *WorkerRequest) {
	set := func(dst **string, src *string) {
		if src != nil {
			v := *src
			*dst = &v
		}
	}
	w.given |= req.factFields()
	if req.ModelName != nil {
		w.ModelName = *req.ModelName
	}
	if req.RoutingGroup != nil {
		w.RoutingGroup = *req.RoutingGroup
	} else if req.TenantID != nil {
		w.RoutingGroup = *req.TenantID
	}
	set(&w.Endpoint, req.Endpoint)
	set(&w.KVEventsEndpoint, req.KVEventsEndpoint)
	if req.KVEventsEndpoints != nil {
		w.KVEventsEndpoints = maps.Clone(req.KVEventsEndpoints)
	}
	set(&w.ReplayEndpoint, req.ReplayEndpoint)
	if req.BlockSize != nil {
		v := *req.BlockSize
		w.BlockSize = &v
	}
	if req.DataParallelStartRank != nil {
		w.DataParallelStartRank = *req.DataParallelStartRank
	}
	if req.DataParallelSize != nil {
		w.DataParallelSize = *req.DataParallelSize
	}
	if req.MaxNumBatchedTokens != nil {
		v := *req.MaxNumBatchedTokens
		w.MaxNumBatchedTokens = &v
	}
	if req.TotalKVBlocks != nil {
		v := *req.TotalKVBlocks
		w.TotalKVBlocks = &v
	}
	set(&w.StableRoutingID, req.StableRoutingID)
	if req.IsEagle != nil {
		v := *req.IsEagle
		w.IsEagle = &v
	}
	if req.Taints != nil {
		w.Taints = slices.Clone(req.Taints)
	}
	if req.TopologyDomains != nil {
		w.TopologyDomains = maps.Clone(req.TopologyDomains)
	}
	set(&w.KVTransferDomain, req.KVTransferDomain)
	set(&w.KVTransferEnforcement, req.KVTransferEnforcement)
	if req.KVTransferPreferredWeight != nil {
		v := *req.KVTransferPreferredWeight
		w.KVTransferPreferredWeight = &v
	}
	set(&w.RouterHintWorkerType, req.RouterHintWorkerType)
	if req.RouterHintSourceControl != nil {
		w.RouterHintSourceControl = maps.Clone(req.RouterHintSourceControl)
	}
	if req.LoraAdapters != nil {
		w.LoraAdapters = normalAdapters(req.LoraAdapters)
	}
	if req.MaxModelLen != nil {
		v := *req.MaxModelLen
		w.MaxModelLen = &v
	}
	if req.EngineBlockSize != nil {
		v := *req.EngineBlockSize
		w.EngineBlockSize = &v
	}
}

// prepare makes a merged record ready to commit: partition names with
// their defaults, bounds, then lifecycle. Bounds come first because
// validate lists the record's ranks.
func (w *WorkerRecord) prepare(cfg *Config) error {
	if w.BlockSize == nil && w.EngineBlockSize != nil {
		// Nothing declared a block size: the engine's is the one.
		v := *w.EngineBlockSize
		w.BlockSize = &v
	}
	key := w.Partition()
	w.ModelName, w.RoutingGroup = key.Model, key.Group
	if err := w.checkBounds(cfg); err != nil {
		return err
	}
	if err := w.checkAdapterBounds(); err != nil {
		return err
	}
	w.validate(cfg)
	return nil
}

// validate fills Lifecycle and NotSchedulableReasons (docs/selection-api.md, "Workers").
func (w *WorkerRecord) validate(cfg *Config) {
	reasons := w.incompleteReasons(cfg.UseKVEvents && !cfg.KVEventsBound)
	if reasons == nil {
		reasons = []string{}
		w.Lifecycle = LifecycleSchedulable
	} else {
		w.Lifecycle = LifecycleIncomplete
	}
	w.NotSchedulableReasons = reasons
	w.LoadOnlyReasons = w.loadOnlyReasons()
}

// incompleteReasons lists what the record lacks to be scheduled, nil when
// nothing. needEvents adds the per-rank KV-event endpoints that event mode
// without a bound socket needs.
func (w *WorkerRecord) incompleteReasons(needEvents bool) []string {
	var reasons []string
	if w.Endpoint == nil || *w.Endpoint == "" {
		reasons = append(reasons, "endpoint is required")
	}
	switch {
	case w.BlockSize == nil:
		// Neither the registration nor the catalog's default gave one.
		reasons = append(reasons, "block_size is required")
	case *w.BlockSize == 0:
		reasons = append(reasons, "block_size must be greater than 0")
	}
	if w.DataParallelSize == 0 {
		reasons = append(reasons, "data_parallel_size must be greater than 0")
	}
	if needEvents {
		for _, r := range w.Ranks() {
			switch ep := w.EventEndpoint(r.DPRank); {
			case ep == "":
				reasons = append(reasons, fmt.Sprintf("kv_events endpoint is required for dp_rank %d", r.DPRank))
			case !ValidZMQEndpoint(ep):
				reasons = append(reasons, fmt.Sprintf("kv_events endpoint %q for dp_rank %d is not tcp://, ipc:// or inproc://", ep, r.DPRank))
			}
		}
	}
	if w.ReplayEndpoint != nil && *w.ReplayEndpoint != "" && w.DataParallelSize > 1 {
		reasons = append(reasons, "replay_endpoint is supported only for data_parallel_size 1")
	}
	return reasons
}

// eagle reports the record's Eagle setting, off when unset.
func (w *WorkerRecord) eagle() bool { return w.IsEagle != nil && *w.IsEagle }

func newWorkerRecord(id uint64, cfg *Config) WorkerRecord {
	w := WorkerRecord{
		WorkerID:                id,
		ModelName:               "default",
		RoutingGroup:            "default",
		DataParallelSize:        1,
		Taints:                  []string{},
		TopologyDomains:         map[string]string{},
		RouterHintSourceControl: map[string]string{},
	}
	if cfg.DefaultBlockSize > 0 {
		bs := cfg.DefaultBlockSize
		w.BlockSize = &bs
		// The catalog's default is a declaration too: an engine that runs
		// another block size is reported, not followed (docs/engine-facts.md).
		w.given |= factBlockSize
	}
	return w
}

// ValidZMQEndpoint reports whether s is a ZMQ endpoint a subscriber can
// connect to: tcp://host:port, ipc://path or inproc://name.
func ValidZMQEndpoint(s string) bool {
	for _, p := range []string{"tcp://", "ipc://", "inproc://"} {
		if strings.HasPrefix(s, p) && len(s) > len(p) {
			return true
		}
	}
	return false
}

// sortRecords orders records by worker id, as GET /workers lists them.
func sortRecords(recs []WorkerRecord) {
	sort.Slice(recs, func(i, j int) bool { return recs[i].WorkerID < recs[j].WorkerID })
}
