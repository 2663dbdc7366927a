// Package caddymodule plugs the KV-aware router into Caddy: the kv_router
// app that owns the selection router and keeps it across config reloads,
// the kv_selection handler that serves Dynamo's selection API, and their
// Caddyfile syntax. It is the only package of the project that imports
// Caddy; the routing decisions themselves live in package selection.
package caddymodule

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/indexer"
	"github.com/kvrouter/caddy-kvrouter/selection"
)

func init() {
	caddy.RegisterModule(App{})
}

// routers holds the selection router of the kv_router app. It is pooled so
// that a config reload hands the running router (its catalog, reservations,
// pending selections and index) to the new config instead of rebuilding it:
// the new config's Provision raises the count before the old config's
// Cleanup lowers it, so the router is destroyed only when a config without
// the app replaces the last one that had it.
var routers = caddy.NewUsagePool()

// routerKey is the only key of routers: Caddy runs at most one kv_router app,
// so the process has one router.
const routerKey = "default"

// App is the kv_router app. It owns the selection router that every
// kv_router module of the process shares: the worker catalog, the load
// accounting, the reservations and the prefix index. Handlers reach it with
// ctx.App("kv_router").
//
// The router survives config reloads: workers registered through the
// selection API, reservations and cached prefixes are kept. Workers declared
// in this config are upserted on every load, and a worker that an earlier
// config declared but this one does not is deleted. The scheduler settings
// are read once, when the router is created; a reload that changes them logs
// a warning and the new values take effect only after Caddy restarts.
type App struct {
	// BlockSize is the default KV block size, in tokens, for workers that do
	// not give their own: the workers declared here and those registered
	// through the selection API without block_size. Zero, the default, means
	// there is no default and every worker must give its block size.
	BlockSize uint32 `json:"block_size,omitempty"`

	// UseKVEvents selects the event-fed prefix index, which follows the
	// KV-cache events the workers publish over ZMQ: the gateway subscribes to
	// each worker rank's kv_events endpoint (or receives them on
	// kv_events_bind), replays gaps from replay endpoints, and a worker
	// needs a kv_events endpoint to be schedulable. When false, the router
	// uses its approximate index instead, which assumes that a prefix booked
	// on a worker stays cached there for approx_ttl. Default: true.
	UseKVEvents *bool `json:"use_kv_events,omitempty"`

	// KVEventsBind, when set, makes the gateway bind one ZMQ SUB socket on
	// this endpoint (for example "tcp://*:5557") that the workers' publishers
	// connect to, instead of subscribing to each worker. Each publisher must
	// use the topic kv@<worker_id>@<model_name>; workers then need no
	// kv_events endpoint of their own. Default: unset (the gateway connects).
	KVEventsBind string `json:"kv_events_bind,omitempty"`

	// OverlapScoreCredit is the cost credit, in blocks, for each prompt block
	// already cached on a worker's device. It must be finite and
	// non-negative. Default: 1.0.
	OverlapScoreCredit *float64 `json:"overlap_score_credit,omitempty"`

	// OverlapScoreCreditDecay reduces the device-cache credit of workers in
	// proportion to their load, so that a busy worker with a cached prefix
	// loses some of its advantage. It must be finite and non-negative.
	// Default: 0 (no decay).
	OverlapScoreCreditDecay *float64 `json:"overlap_score_credit_decay,omitempty"`

	// PrefillLoadScale multiplies the uncached prefill blocks in the cost.
	// It must be finite and non-negative. Default: 1.0.
	PrefillLoadScale *float64 `json:"prefill_load_scale,omitempty"`

	// DecodeActiveRequestWeight is the cost added for each request a worker
	// is already serving. It must be finite and non-negative. Default: 0.
	DecodeActiveRequestWeight *float64 `json:"decode_active_request_weight,omitempty"`

	// HostCacheHitWeight is the credit for each block cached in a worker's
	// host memory beyond its device prefix. It must be finite and
	// non-negative. Default: 0.75.
	HostCacheHitWeight *float64 `json:"host_cache_hit_weight,omitempty"`

	// DiskCacheHitWeight is the credit for each block cached on a worker's
	// disk or external tier beyond its host prefix. It must be finite and
	// non-negative. Default: 0.25.
	DiskCacheHitWeight *float64 `json:"disk_cache_hit_weight,omitempty"`

	// SharedCacheMultiplier is the credit for each block found in a shared
	// cache beyond a worker's device prefix. It must be finite and
	// non-negative. Default: 0.
	SharedCacheMultiplier *float64 `json:"shared_cache_multiplier,omitempty"`

	// RouterTemperature is the softmax temperature of the worker choice.
	// Zero always picks the cheapest worker; higher values spread requests
	// over workers of similar cost. It must be finite and non-negative.
	// Default: 0.
	RouterTemperature *float64 `json:"router_temperature,omitempty"`

	// AssumeKVReuse makes the decode-block count of a worker count a prefix
	// shared by several of its requests once. Default: true.
	AssumeKVReuse *bool `json:"assume_kv_reuse,omitempty"`

	// TrackPrefillTokens counts the prefill tokens of in-flight requests in
	// the cost. Default: true.
	TrackPrefillTokens *bool `json:"track_prefill_tokens,omitempty"`

	// TrackActiveBlocks counts the decode blocks of in-flight requests in the
	// cost. Default: true.
	TrackActiveBlocks *bool `json:"track_active_blocks,omitempty"`

	// TrackOutputBlocks counts the output blocks that clients report through
	// the selection API's output_block route. Default: false.
	TrackOutputBlocks *bool `json:"track_output_blocks,omitempty"`

	// DecodeBusyThreshold, when set, makes selections report decode_busy when
	// a worker's potential decode blocks exceed this fraction of its
	// total_kv_blocks. It must be finite and non-negative. Default: unset.
	DecodeBusyThreshold *float64 `json:"decode_busy_threshold,omitempty"`

	// PrefillBusyThreshold, when set, makes advisory selections report
	// prefill_busy when a worker's active prefill tokens exceed this
	// fraction of its max_num_batched_tokens. It must be finite and
	// non-negative. Default: unset.
	PrefillBusyThreshold *float64 `json:"prefill_busy_threshold,omitempty"`

	// ApproxTTL is how long the approximate index treats a prefix booked on
	// a worker as cached there. Default: 120s.
	ApproxTTL caddy.Duration `json:"approx_ttl,omitempty"`

	// SessionAffinityTTL enables session affinity when positive: requests
	// that carry the same session id go to the same worker while the session
	// has been idle for less than this long. It must be between 1s and one
	// year. Default: 0 (off).
	SessionAffinityTTL caddy.Duration `json:"session_affinity_ttl,omitempty"`

	// SessionAffinityMode is "hard" or "soft". With "hard", a reservation on
	// a worker other than the session's bound worker is rejected; with
	// "soft", the binding follows the worker the request was dispatched to.
	// Default: "hard".
	SessionAffinityMode string `json:"session_affinity_mode,omitempty"`

	// SessionTableCap bounds the number of session bindings kept.
	// Default: 65536.
	SessionTableCap int `json:"session_table_cap,omitempty"`

	// PendingTTL is how long a /select answer given with a selection_id is
	// kept for a later /reservations call. Default: 120s.
	PendingTTL caddy.Duration `json:"pending_ttl,omitempty"`

	// PendingMaxEntries bounds the number of pending selections kept.
	// Default: 4096.
	PendingMaxEntries int `json:"pending_max_entries,omitempty"`

	// PendingMaxBytes bounds the memory, in bytes, used by pending
	// selections. Default: 268435456 (256 MiB).
	PendingMaxBytes int64 `json:"pending_max_bytes,omitempty"`

	// ReservationTTL frees a reservation that is still held after this long,
	// for clients that never sent its release. Default: 1h.
	ReservationTTL caddy.Duration `json:"reservation_ttl,omitempty"`

	// WorkerDownAfter takes a worker out of the candidates, and drops its
	// KV index entries, once the proxy has failed to reach it (dial errors,
	// and 502, 503 or 504 answers, whether from the worker or from
	// reverse_proxy) for this long with no success in between; a 429 is a
	// full worker, not a failed one, and counts neither way. While it is
	// out, its GET /health is probed periodically and it comes back as soon
	// as that answers 2xx. Zero disables it. Default: 30s.
	WorkerDownAfter *caddy.Duration `json:"worker_down_after,omitempty"`

	// MaxWorkers bounds the number of workers in the catalog.
	// Default: 65536.
	MaxWorkers int `json:"max_workers,omitempty"`

	// IndexMaxEntries bounds the KV index, in (block, worker rank) entries.
	// When it is reached, the oldest entries are evicted to make room
	// (counted in kvrouter_index_evicted_total). Workers' own cache
	// evictions normally keep the index well below it. Default: derived
	// from index_max_memory.
	IndexMaxEntries int64 `json:"index_max_entries,omitempty"`

	// Limits are the bounds on what clients and publishers can make the
	// gateway hold (limits.go); their fields sit at this level.
	Limits

	// Workers are the workers declared in the config. They are upserted into
	// the catalog on every config load, replacing any change made through
	// the selection API, and a worker removed from this list is deleted on
	// the next load. Workers registered through the selection API are not
	// touched.
	Workers []WorkerConfig `json:"workers,omitempty"`

	state  *routerState
	loaded bool // routers holds one reference for this App
	logger *zap.Logger
}

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

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "kv_router",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision builds the router, or takes over the one kept from the previous
// config, and brings the catalog in line with the declared workers.
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	cfg, workers, err := a.build()
	if err != nil {
		return err
	}
	val, loaded, err := routers.LoadOrNew(routerKey, func() (caddy.Destructor, error) {
		return newRouterState(cfg, a.KVEventsBind, a.Limits.events(a.IndexMaxEntries), a.logger)
	})
	if err != nil {
		return fmt.Errorf("creating router: %v", err)
	}
	a.loaded = true
	a.state = val.(*routerState)
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %v", err)
	}
	if loaded {
		// The router keeps the settings it was built with: rebuilding it
		// would drop its reservations and index, and selection.Router has no
		// way yet to change them in place.
		if changed := changedSettings(a.state.router.Config(), cfg); len(changed) > 0 {
			a.logger.Warn("kv_router settings changed; the running router keeps its previous settings until Caddy restarts",
				zap.Strings("settings", changed))
		}
	}
	gen, err := a.state.syncWorkers(workers, a.logger)
	if err != nil {
		return err
	}
	a.logger.Info("router ready",
		zap.Bool("reused", loaded),
		zap.Int("generation", gen),
		zap.Int("config_workers", len(workers)),
		zap.Int("workers", len(a.state.router.ListWorkers("", ""))),
		zap.Int("active_reservations", a.state.router.ActiveReservations()))
	return nil
}

// Validate checks the config without side effects. Provision runs the same
// checks before it touches the shared router.
func (a *App) Validate() error {
	_, _, err := a.build()
	return err
}

// Start implements caddy.App. The router runs from Provision on, so there is
// nothing to start.
func (a *App) Start() error { return nil }

// Stop implements caddy.App. The router outlives the config (see Cleanup),
// so there is nothing to stop.
func (a *App) Stop() error { return nil }

// Cleanup releases this config's reference to the pooled router; the last
// release closes it.
func (a *App) Cleanup() error {
	if !a.loaded {
		return nil
	}
	a.loaded = false
	_, err := routers.Delete(routerKey)
	return err
}

// kvApp returns the config's kv_router app (created with default settings
// when the config has none) once it has a router.
func kvApp(ctx caddy.Context) (*App, error) {
	appIface, err := ctx.App("kv_router")
	if err != nil {
		return nil, fmt.Errorf("getting kv_router app: %v", err)
	}
	app, ok := appIface.(*App)
	if !ok {
		return nil, fmt.Errorf("kv_router app has unexpected type %T", appIface)
	}
	if app.Router() == nil {
		return nil, errors.New("kv_router app has no router")
	}
	return app, nil
}

// Router returns the selection router. It is nil before Provision.
func (a *App) Router() *selection.Router {
	if a.state == nil {
		return nil
	}
	return a.state.router
}

// build turns the config into router settings and worker upserts, and
// reports the first invalid setting. It has no side effects.
func (a *App) build() (selection.Config, []*selection.WorkerRequest, error) {
	cfg := selection.DefaultConfig()
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
	for _, f := range []struct {
		name string
		v    int64
		set  func(int64)
	}{
		{"session_table_cap", int64(a.SessionTableCap), func(v int64) { cfg.SessionTableCap = int(v) }},
		{"pending_max_entries", int64(a.PendingMaxEntries), func(v int64) { cfg.PendingMaxEntries = int(v) }},
		{"pending_max_bytes", a.PendingMaxBytes, func(v int64) { cfg.PendingMaxBytes = v }},
		{"max_workers", int64(a.MaxWorkers), func(v int64) { cfg.MaxWorkers = int(v) }},
	} {
		if f.v < 0 {
			return cfg, nil, fmt.Errorf("%s must not be negative", f.name)
		}
		if f.v > 0 {
			f.set(f.v)
		}
	}
	if err := cfg.Validate(); err != nil {
		return cfg, nil, err
	}

	workers, err := a.workerRequests()
	if err != nil {
		return cfg, nil, err
	}
	return cfg, workers, nil
}

// workerRequests checks the declared workers and returns their upserts. It
// rejects what the catalog would accept only as an incomplete or
// conflicting worker, so that a bad config fails before the shared router
// is changed.
func (a *App) workerRequests() ([]*selection.WorkerRequest, error) {
	reqs := make([]*selection.WorkerRequest, 0, len(a.Workers))
	seen := make(map[uint64]bool, len(a.Workers))
	blockSizes := make(map[string]uint32) // partition → block size
	for i, w := range a.Workers {
		if w.WorkerID == nil {
			return nil, fmt.Errorf("workers[%d]: worker_id is required", i)
		}
		id := *w.WorkerID
		if seen[id] {
			return nil, fmt.Errorf("worker %d: declared more than once", id)
		}
		seen[id] = true
		if w.Endpoint == "" {
			return nil, fmt.Errorf("worker %d: endpoint is required", id)
		}
		bs := w.BlockSize
		if bs == 0 {
			bs = a.BlockSize
		}
		if bs == 0 {
			return nil, fmt.Errorf("worker %d: block_size is required (set it on the worker or as the kv_router default)", id)
		}
		dpSize := w.DataParallelSize
		if dpSize == 0 {
			dpSize = 1
		}
		if w.ReplayEndpoint != "" && dpSize > 1 {
			return nil, fmt.Errorf("worker %d: replay_endpoint is supported only for data_parallel_size 1", id)
		}
		part := partitionName(w.ModelName, w.RoutingGroup)
		if prev, ok := blockSizes[part]; ok && prev != bs {
			return nil, fmt.Errorf("worker %d: block_size %d conflicts with block_size %d of the other workers of %s", id, bs, prev, part)
		}
		blockSizes[part] = bs
		reqs = append(reqs, w.request(bs, dpSize))
	}
	return reqs, nil
}

// request is the catalog upsert for the worker, with its block size and
// data-parallel size resolved.
func (w *WorkerConfig) request(blockSize, dpSize uint32) *selection.WorkerRequest {
	id, start := *w.WorkerID, w.DataParallelStartRank
	req := &selection.WorkerRequest{
		WorkerID:              &id,
		Endpoint:              stringPtr(w.Endpoint),
		BlockSize:             &blockSize,
		DataParallelStartRank: &start,
		DataParallelSize:      &dpSize,
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

// partitionName names a (model, routing group) with the catalog's defaults.
func partitionName(model, group string) string {
	if model == "" {
		model = "default"
	}
	if group == "" {
		group = "default"
	}
	return model + ":" + group
}

// routerState is the pooled value: the router, the KV-event listeners that
// feed its index (with use_kv_events), and what the configs that shared it
// have declared. Listeners belong to it, so a reload neither drops nor
// duplicates them.
type routerState struct {
	router *selection.Router
	events *indexer.Manager // nil without use_kv_events

	mu         sync.Mutex
	fromConfig map[uint64]struct{} // worker ids declared by the latest config
	generation int                 // configs that have provisioned with this router
}

// syncWorkers upserts the declared workers and deletes those an earlier
// config declared and this one does not. It returns how many configs have
// used the router, this one included.
//
// Upserts run before deletions, so a rejected upsert leaves the workers of
// the previous config in place; the ones upserted before it stay and are
// remembered as declared, so that a later config can remove them.
func (s *routerState) syncWorkers(reqs []*selection.WorkerRequest, logger *zap.Logger) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.generation++
	next := make(map[uint64]struct{}, len(reqs))
	for _, req := range reqs {
		if _, err := s.router.UpsertWorker(req); err != nil {
			for id := range next {
				s.fromConfig[id] = struct{}{}
			}
			return s.generation, fmt.Errorf("worker %d: %v", *req.WorkerID, err)
		}
		next[*req.WorkerID] = struct{}{}
	}
	for id := range s.fromConfig {
		if _, keep := next[id]; keep {
			continue
		}
		// Not found means the worker was already deleted through the API.
		if _, err := s.router.DeleteWorker(id); err == nil {
			logger.Info("deleted worker removed from the config", zap.Uint64("worker_id", id))
		}
	}
	s.fromConfig = next
	return s.generation, nil
}

// newRouterState builds the router and, in event mode, the index and the
// listener manager that follows the router's catalog.
func newRouterState(cfg selection.Config, bind string, limits eventLimits, logger *zap.Logger) (*routerState, error) {
	s := &routerState{fromConfig: map[uint64]struct{}{}}
	opts := []selection.Option{selection.WithEndpointCheck(newSelfGuard().check)}
	if cfg.UseKVEvents {
		idx := indexer.New()
		idx.MaxEntries = limits.maxEntries
		m, err := indexer.NewManager(idx, logger.Named("kv_events"), limits.manager...)
		if err != nil {
			return nil, fmt.Errorf("kv events: %v", err)
		}
		s.events = m
		opts = append(opts, selection.WithIndexer(m.Index), selection.WithCatalogHook(m.OnCatalogChange))
	}
	r, err := selection.NewRouter(cfg, opts...)
	if err != nil {
		if s.events != nil {
			_ = s.events.Close()
		}
		return nil, err
	}
	s.router = r
	if bind != "" {
		b, err := s.events.Bind(bind, indexer.ResolverFor(r))
		if err != nil {
			_ = s.Destruct()
			return nil, err
		}
		logger.Info("receiving kv events", zap.String("bind", b.Endpoint()))
	}
	return s, nil
}

// Events returns the KV-event listener manager, or nil without
// use_kv_events.
func (a *App) Events() *indexer.Manager {
	if a.state == nil {
		return nil
	}
	return a.state.events
}

// Destruct stops the router's background work and the KV-event listeners
// when the last config that used them is unloaded.
func (s *routerState) Destruct() error {
	s.router.Close()
	if s.events != nil {
		return s.events.Close()
	}
	return nil
}

// settingNames maps the selection.Config fields whose kv_router option has
// another name; the others are the field name in snake_case.
var settingNames = map[string]string{
	"DefaultBlockSize":       "block_size",
	"SessionAffinitySoft":    "session_affinity_mode",
	"MaxReservationsPerRank": "max_reservations_per_worker",
}

// changedSettings lists, by kv_router option name, the router settings that
// differ between old and cur.
func changedSettings(old, cur selection.Config) []string {
	var out []string
	ov, cv := reflect.ValueOf(old), reflect.ValueOf(cur)
	t := ov.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() || f.Type.Kind() == reflect.Func {
			continue
		}
		if reflect.DeepEqual(ov.Field(i).Interface(), cv.Field(i).Interface()) {
			continue
		}
		if name, ok := settingNames[f.Name]; ok {
			out = append(out, name)
		} else {
			out = append(out, snakeCase(f.Name))
		}
	}
	return out
}

// snakeCase turns a Go field name into its snake_case form, keeping
// initialisms together: ApproxTTL → approx_ttl, UseKVEvents → use_kv_events.
func snakeCase(name string) string {
	rs := []rune(name)
	var b strings.Builder
	for i, r := range rs {
		if unicode.IsUpper(r) && i > 0 {
			prevLower := unicode.IsLower(rs[i-1])
			nextLower := i+1 < len(rs) && unicode.IsLower(rs[i+1])
			if prevLower || (unicode.IsUpper(rs[i-1]) && nextLower) {
				b.WriteByte('_')
			}
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

// Interface guards
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.Validator    = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
	_ caddy.Destructor   = (*routerState)(nil)
)
