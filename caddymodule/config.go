package caddymodule

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// WorkerConfig declares one worker of the catalog.
type WorkerConfig struct {
	// WorkerID is the worker's id in the catalog and in the selection API.
	// It is required and must be unique among the declared workers.
	WorkerID *uint64 `json:"worker_id,omitempty"`

	// ModelName is the model the worker serves. Requests name it in
	// model_name. Default: "default".
	ModelName string `json:"model_name,omitempty"`

	// RoutingGroup is the routing group of the worker within its model.
	// Default: "default".
	RoutingGroup string `json:"routing_group,omitempty"`

	// Endpoint is the worker's address as returned by selections, for
	// example "10.0.0.1:8000". Required.
	Endpoint string `json:"endpoint,omitempty"`

	// KVEventsEndpoint is the ZMQ endpoint where the worker publishes its
	// KV-cache events, for example "tcp://10.0.0.1:5557" (vLLM's default port
	// is 5557, plus the rank for data-parallel ranks). With use_kv_events on
	// and no kv_events_bind, the gateway subscribes to it.
	KVEventsEndpoint string `json:"kv_events_endpoint,omitempty"`

	// ReplayEndpoint is the ZMQ endpoint that replays the worker's missed
	// KV-cache events. Only a worker with one data-parallel rank may have one.
	ReplayEndpoint string `json:"replay_endpoint,omitempty"`

	// BlockSize is the worker's KV block size in tokens. All workers of a
	// model and routing group must share one block size. Default: the app's
	// block_size.
	BlockSize uint32 `json:"block_size,omitempty"`

	// DataParallelStartRank is the first global data-parallel rank the
	// worker serves. Default: 0.
	DataParallelStartRank uint32 `json:"data_parallel_start_rank,omitempty"`

	// DataParallelSize is the number of data-parallel ranks the worker
	// serves; each rank is scheduled on its own. Default: 1.
	DataParallelSize uint32 `json:"data_parallel_size,omitempty"`

	// MaxNumBatchedTokens is the worker's prefill token budget per batch,
	// used for the prefill_busy report. Default: unknown.
	MaxNumBatchedTokens uint64 `json:"max_num_batched_tokens,omitempty"`

	// TotalKVBlocks is the number of KV blocks the worker can hold, used for
	// the decode_busy report. Default: unknown.
	TotalKVBlocks uint64 `json:"total_kv_blocks,omitempty"`
}

// build turns the config into router settings and worker upserts, and
// reports the first invalid setting. It has no side effects.
func (a *App) build() (selection.Config, []*selection.WorkerRequest, error) {
	cfg := selection.GatewayConfig()
	if a.UseKVEvents != nil {
		cfg.UseKVEvents = *a.UseKVEvents
	}
	if a.KVEventsBind != "" {
		if !cfg.UseKVEvents {
			return cfg, nil, errors.New("kv_events_bind needs use_kv_events on")
		}
		if !selection.ValidZMQEndpoint(a.KVEventsBind) {
			return cfg, nil, fmt.Errorf("kv_events_bind %q is not a tcp://, ipc:// or inproc:// endpoint", a.KVEventsBind)
		}
		cfg.KVEventsBound = true
	}
	if _, err := bindPeers(a.KVEventsBindPeers); err != nil {
		return cfg, nil, err
	}
	if a.KVEventsBindPeers != "" && a.KVEventsBind == "" {
		return cfg, nil, errors.New("kv_events_bind_peers needs kv_events_bind")
	}
	cfg.DefaultBlockSize = a.BlockSize
	if a.IndexMaxEntries < 0 {
		return cfg, nil, errors.New("index_max_entries must not be negative")
	}

	for _, f := range []struct {
		name string
		src  *float64
		dst  *float64
	}{
		{"overlap_score_credit", a.OverlapScoreCredit, &cfg.OverlapScoreCredit},
		{"overlap_score_credit_decay", a.OverlapScoreCreditDecay, &cfg.OverlapScoreCreditDecay},
		{"prefill_load_scale", a.PrefillLoadScale, &cfg.PrefillLoadScale},
		{"decode_active_request_weight", a.DecodeActiveRequestWeight, &cfg.DecodeActiveRequestWeight},
		{"host_cache_hit_weight", a.HostCacheHitWeight, &cfg.HostCacheHitWeight},
		{"disk_cache_hit_weight", a.DiskCacheHitWeight, &cfg.DiskCacheHitWeight},
		{"shared_cache_multiplier", a.SharedCacheMultiplier, &cfg.SharedCacheMultiplier},
		{"router_temperature", a.RouterTemperature, &cfg.RouterTemperature},
	} {
		if f.src != nil {
			*f.dst = *f.src
		}
	}
	for _, f := range []struct {
		src *bool
		dst *bool
	}{
		{a.AssumeKVReuse, &cfg.AssumeKVReuse},
		{a.TrackPrefillTokens, &cfg.TrackPrefillTokens},
		{a.TrackActiveBlocks, &cfg.TrackActiveBlocks},
		{a.TrackOutputBlocks, &cfg.TrackOutputBlocks},
		{a.InFlightOverlap, &cfg.InFlightOverlap},
		{a.UnclippedOverlapCredit, &cfg.UnclippedOverlapCredit},
	} {
		if f.src != nil {
			*f.dst = *f.src
		}
	}
	for _, f := range []struct {
		name string
		v    *float64
		dst  **float64
	}{
		{"decode_busy_threshold", a.DecodeBusyThreshold, &cfg.DecodeBusyThreshold},
		{"prefill_busy_threshold", a.PrefillBusyThreshold, &cfg.PrefillBusyThreshold},
	} {
		if f.v == nil {
			continue
		}
		if math.IsNaN(*f.v) || math.IsInf(*f.v, 0) || *f.v < 0 {
			return cfg, nil, fmt.Errorf("%s must be finite and non-negative", f.name)
		}
		v := *f.v
		*f.dst = &v
	}
	for _, f := range []struct {
		name string
		v    caddy.Duration
		dst  *time.Duration
	}{
		{"approx_ttl", a.ApproxTTL, &cfg.ApproxTTL},
		{"session_affinity_ttl", a.SessionAffinityTTL, &cfg.SessionAffinityTTL},
		{"pending_ttl", a.PendingTTL, &cfg.PendingTTL},
		{"reservation_ttl", a.ReservationTTL, &cfg.ReservationTTL},
	} {
		if f.v < 0 {
			return cfg, nil, fmt.Errorf("%s must not be negative", f.name)
		}
		if f.v > 0 {
			*f.dst = time.Duration(f.v)
		}
	}
	if a.WorkerDownAfter != nil {
		// Zero is meaningful here: it turns dead-worker detection off.
		if *a.WorkerDownAfter < 0 {
			return cfg, nil, errors.New("worker_down_after must not be negative")
		}
		cfg.WorkerDownAfter = time.Duration(*a.WorkerDownAfter)
	}
	if err := a.Limits.apply(&cfg); err != nil {
		return cfg, nil, err
	}
	switch a.SessionAffinityMode {
	case "", "hard":
		cfg.SessionAffinitySoft = false
	case "soft":
		cfg.SessionAffinitySoft = true
	default:
		return cfg, nil, fmt.Errorf("session_affinity_mode must be hard or soft, not %q", a.SessionAffinityMode)
	}
	if err := applyCounts([]countSetting{
		{"session_table_cap", int64(a.SessionTableCap), func(v int64) { cfg.SessionTableCap = int(v) }},
		{"pending_max_entries", int64(a.PendingMaxEntries), func(v int64) { cfg.PendingMaxEntries = int(v) }},
		{"pending_max_bytes", a.PendingMaxBytes, func(v int64) { cfg.PendingMaxBytes = v }},
		{"max_workers", int64(a.MaxWorkers), func(v int64) { cfg.MaxWorkers = int(v) }},
	}); err != nil {
		return cfg, nil, err
	}
	if err := cfg.Validate(); err != nil {
		return cfg, nil, err
	}

	workers, err := a.workerRequests()
	if err != nil {
		return cfg, nil, err
	}
	// The catalog's own rules, checked before the shared router changes.
	if err := cfg.CheckWorkers(workers); err != nil {
		return cfg, nil, err
	}
	return cfg, workers, nil
}

// workerRequests returns the declared workers' upserts. A worker_id is the
// only field it requires: selection.Config.CheckWorkers holds the catalog's
// rules for the rest.
func (a *App) workerRequests() ([]*selection.WorkerRequest, error) {
	reqs := make([]*selection.WorkerRequest, 0, len(a.Workers))
	for i := range a.Workers {
		if a.Workers[i].WorkerID == nil {
			return nil, fmt.Errorf("workers[%d]: worker_id is required", i)
		}
		reqs = append(reqs, a.Workers[i].request(a.BlockSize))
	}
	return reqs, nil
}

// request is the catalog upsert for the worker, with its block size and
// data-parallel size resolved. The block size falls back to this config's
// block_size here rather than in the catalog because the running router
// keeps the default of the config that created it; with neither set it is
// left out, and CheckWorkers names it.
func (w *WorkerConfig) request(defaultBlockSize uint32) *selection.WorkerRequest {
	id, start, dpSize := *w.WorkerID, w.DataParallelStartRank, max(w.DataParallelSize, 1)
	req := &selection.WorkerRequest{
		WorkerID:              &id,
		Endpoint:              stringPtr(w.Endpoint),
		DataParallelStartRank: &start,
		DataParallelSize:      &dpSize,
	}
	if bs := cmp.Or(w.BlockSize, defaultBlockSize); bs > 0 {
		req.BlockSize = &bs
	}
	if w.ModelName != "" {
		req.ModelName = stringPtr(w.ModelName)
	}
	if w.RoutingGroup != "" {
		req.RoutingGroup = stringPtr(w.RoutingGroup)
	}
	if w.KVEventsEndpoint != "" {
		req.KVEventsEndpoint = stringPtr(w.KVEventsEndpoint)
	}
	if w.ReplayEndpoint != "" {
		req.ReplayEndpoint = stringPtr(w.ReplayEndpoint)
	}
	if w.MaxNumBatchedTokens > 0 {
		v := w.MaxNumBatchedTokens
		req.MaxNumBatchedTokens = &v
	}
	if w.TotalKVBlocks > 0 {
		v := w.TotalKVBlocks
		req.TotalKVBlocks = &v
	}
	return req
}

func stringPtr(s string) *string { return &s }

// countSetting is a count or size option: negative is refused, zero keeps
// the default, anything else is set.
type countSetting struct {
	name string
	v    int64
	set  func(int64)
}

// applyCounts sets each count option given, or names the first negative one.
func applyCounts(fs []countSetting) error {
	for _, f := range fs {
		if f.v < 0 {
			return fmt.Errorf("%s must not be negative", f.name)
		}
		if f.v > 0 {
			f.set(f.v)
		}
	}
	return nil
}
