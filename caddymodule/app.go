// Package caddymodule plugs the KV-aware router into Caddy: the kv_router
// app that owns the selection router and keeps it across config reloads,
// the kv_selection handler that serves Dynamo's selection API, and their
// Caddyfile syntax. It is the only package of the project that imports
// Caddy; the routing decisions themselves live in package selection.
package caddymodule

import (
	"errors"
	"fmt"
	"slices"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/indexer"
	"github.com/kvrouter/caddy-kvrouter/selection"
)

func init() {
	caddy.RegisterModule(App{})
}

// App is the kv_router app. It owns the selection router that every
// kv_router module of the process shares: the worker catalog, the load
// accounting, the reservations and the prefix index. Handlers reach it with
// ctx.App("kv_router").
//
// The router survives config reloads: workers registered through the
// selection API, reservations and cached prefixes are kept. Workers declared
// in this config are upserted on every load, and a worker that an earlier
// config declared but this one does not is deleted. Changed settings are
// applied to the running router when the new config starts, except those
// that shape what was built with it (use_kv_events, kv_events_bind,
// track_active_blocks, approx_ttl, the pending cache's and the session
// table's settings, the index bound and the listeners' limits): those keep
// their running values until Caddy restarts, and the log names them.
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

	// KVEventsBind, when set, makes the gateway bind this endpoint (for
	// example "tcp://*:5557") for the workers' publishers to connect to, as
	// a ZMQ subscriber would, instead of subscribing to each worker. Each publisher must
	// use the topic kv@<worker_id>@<model_name>; workers then need no
	// kv_events endpoint of their own. Default: unset (the gateway connects).
	KVEventsBind string `json:"kv_events_bind,omitempty"`

	// KVEventsBindPeers says which publishers may send under a worker's
	// topic to kv_events_bind. "worker_host": a TCP connection may send
	// under one topic only, that of a worker in the catalog whose
	// endpoint's host (resolved, when a name) is the connection's source
	// address; a connection that breaks this is cut off and counted
	// (kvrouter_kv_events_wrong_topic_total). "any": every peer that
	// reaches the endpoint may send under any worker's topic. A socket
	// file (ipc://) is not checked: its permissions say who may dial it.
	// Publishers whose connections come from another address than their
	// worker's endpoint (behind NAT, or a worker registered under a
	// service address) need "any". Default: worker_host.
	KVEventsBindPeers string `json:"kv_events_bind_peers,omitempty"`

	// OverlapScoreCredit is the cost credit, in blocks of prefill load, for
	// each prompt block already cached on a worker's device. It must be
	// finite and non-negative. Default: 8 (Dynamo's is 1.0): a worker that
	// holds a session's context keeps it until its queue is eight times
	// the context's recompute (docs/routing.md).
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

	// InFlightOverlap credits a worker with the leading prompt blocks that
	// requests it is already serving cover, as if cached: it computes them
	// before it admits this prompt. Without it, requests that share a
	// prefix and arrive while the first is still queued spread over the
	// fleet. Default: true (Dynamo: false).
	InFlightOverlap *bool `json:"in_flight_overlap,omitempty"`

	// UnclippedOverlapCredit lets a worker's overlap credit exceed its
	// prefill cost, so the worker that holds more of the prompt always
	// costs less; Dynamo stops the prefill cost at zero, which with a
	// credit above 1 makes every worker holding a shared system prompt
	// equal. Default: true (Dynamo: false).
	UnclippedOverlapCredit *bool `json:"unclipped_overlap_credit,omitempty"`

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
	// When it is reached, entries are evicted to make room (counted in
	// kvrouter_index_evicted_total): the oldest of the worker ranks holding
	// more than their share of the bound (the bound divided by the ranks
	// that have stored blocks and not been cleared, over all models), so
	// one publisher's flood evicts its own entries and not the others'.
	// Workers' own cache evictions normally keep the index well below it.
	// Default: derived from index_max_memory.
	IndexMaxEntries int64 `json:"index_max_entries,omitempty"`

	// Limits are the bounds on what clients and publishers can make the
	// gateway hold (limits.go); their fields sit at this level.
	Limits

	// EngineFactsConfig is how the workers' engines are read for what
	// their registrations left out (enginefacts.go); its fields sit at
	// this level.
	EngineFactsConfig

	// DiscoveryConfig is how workers are found through DNS
	// (discover.go); its field sits at this level.
	DiscoveryConfig

	// ClusterConfig joins the other replicas of this gateway over NATS
	// (cluster.go); its field sits at this level.
	ClusterConfig

	// Workers are the workers declared in the config. They are upserted into
	// the catalog on every config load, replacing any change made through
	// the selection API, and a worker removed from this list is deleted on
	// the next load. Workers registered through the selection API are not
	// touched.
	Workers []WorkerConfig `json:"workers,omitempty"`

	state    *routerState
	settings selection.Config           // this config's router settings, applied in Start
	workers  []*selection.WorkerRequest // this config's declared workers, applied in Start
	loaded   bool                       // routers holds one reference for this App
	running  bool                       // Start succeeded and Stop has not run
	logger   *zap.Logger
	facts    *engineReader // reads the engines from Start to Stop; nil when off
	discover *discoverer   // follows the discovered names from Start to Stop
	replica  *clusterLink  // the link to the other replicas, from Start to Stop; nil without
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
	if err := a.EngineFactsConfig.validate(); err != nil {
		return err
	}
	if err := a.DiscoveryConfig.validate(); err != nil {
		return err
	}
	if err := a.ClusterConfig.validate(a.settingsFingerprint()); err != nil {
		return err
	}
	cfg, workers, err := a.build()
	if err != nil {
		return err
	}
	events := a.eventSettings()
	val, loaded, err := routers.LoadOrNew(routerKey, func() (caddy.Destructor, error) {
		return newRouterState(cfg, events, a.Limits.events(a.IndexMaxEntries), a.logger)
	})
	if err != nil {
		return fmt.Errorf("creating router: %v", err)
	}
	a.loaded = true
	a.state = val.(*routerState)
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %v", err)
	}
	if err := registerClusterMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %v", err)
	}
	a.settings, a.workers = cfg, workers
	a.logger.Info("router ready",
		zap.Bool("reused", loaded),
		zap.Int("config_workers", len(workers)),
		zap.Int("workers", len(a.state.router.Catalog().ListWorkers("", ""))),
		zap.Int("active_reservations", a.state.router.ActiveReservations()))
	return nil
}

// Validate checks the config without side effects. Provision runs the same
// checks before it touches the shared router.
func (a *App) Validate() error {
	_, _, err := a.build()
	return err
}

// Start applies this config to the running router: its settings, then
// its declared workers (so a reload may raise a bound and use it), then
// the reading of its workers' engines (enginefacts.go), its discovered
// names (discover.go) and its link to the other replicas. A reload changes
// the settings in place, keeping workers, bookings, the index and the
// listeners; the few settings that shape what the router and its
// listeners built at start keep their running values until Caddy
// restarts, and the log names them.
//
// Nothing is applied in Provision, and what Start applied is undone when
// the load fails after all (here, or in another app's Start: Stop says
// so, see routerState.stopped): a load Caddy refused used to leave its
// workers and settings in the running router, where resending the good
// config, "unchanged" to Caddy, could not undo them.
func (a *App) Start() (err error) {
	prev := a.state.began(a)
	defer func() {
		if err != nil {
			a.state.restore(a, prev, a.logger)
		}
	}()
	if err := a.applySettings(); err != nil {
		return err
	}
	gen, err := a.state.syncWorkers(a.workers, a.logger)
	if err != nil {
		return err
	}
	a.logger.Info("declared workers applied", zap.Int("generation", gen), zap.Int("config_workers", len(a.workers)))
	if a.replica, err = a.ClusterConfig.start(a.state.router, a.settingsFingerprint(), a.logger.Named("cluster")); err != nil {
		return err
	}
	a.facts = a.EngineFactsConfig.start(a.state.router.Catalog(), a.logger.Named("engine_facts"))
	a.discover = a.DiscoveryConfig.start(a.state.router.Catalog(), a.BlockSize, a.logger.Named("discovery"))
	a.running = true
	return nil
}

// applySettings applies this config's router settings, and logs what
// changed and what waits for a restart.
func (a *App) applySettings() error {
	running := a.state.router.Config()
	changed := changedSettings(running, a.settings)
	if len(changed) == 0 && a.state.created == a.eventSettings() {
		return nil
	}
	fixed, err := a.state.router.Reconfigure(a.settings)
	if err != nil {
		return fmt.Errorf("applying kv_router settings: %v", err)
	}
	restart := optionNames(fixed)
	applied := slices.DeleteFunc(changed, func(name string) bool { return slices.Contains(restart, name) })
	restart = append(restart, changedSettings(a.state.created, a.eventSettings())...)
	slices.Sort(restart)
	restart = slices.Compact(restart) // kv_events_bind sets two fields
	if len(applied) > 0 {
		a.logger.Info("kv_router settings applied to the running router", zap.Strings("settings", applied))
	}
	if len(restart) > 0 {
		a.logger.Warn("kv_router settings that take effect only when Caddy restarts; the running router keeps its previous values",
			zap.Strings("settings", restart))
	}
	return nil
}

// Stop implements caddy.App. The router outlives the config (see
// Cleanup); only this config's reading of the engines, its DNS discovery
// and its replica link stop (the discovered workers stay, for the next
// config). When this config's load failed after its Start, what Start
// applied is undone.
func (a *App) Stop() error {
	a.running = false
	a.facts.stop()
	a.facts = nil
	a.discover.halt()
	a.replica.stop()
	a.replica = nil
	a.state.stopped(a, a.logger)
	// Handed over once the running config's declared workers are back
	// (when this load failed): its discovery resolves at once, and found
	// a declared worker's endpoint free, a worker of its own there.
	a.discover.stop()
	a.discover = nil
	return nil
}

// Cleanup releases this config's reference to the pooled router; the last
// release closes it. A config whose load failed after every app started
// (Caddy's remote admin or config loader failing to set up) is cleaned up
// without being stopped: Cleanup stops it first, so that its replica link,
// engine reading and discovery end and the running config gets its
// settings, workers and link back. Left running, the config that kept
// running published under the refused config's cluster name.
func (a *App) Cleanup() error {
	if a.running {
		_ = a.Stop()
	}
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

// Events returns the KV-event listener manager, or nil without
// use_kv_events.
func (a *App) Events() *indexer.Manager {
	if a.state == nil {
		return nil
	}
	return a.state.events
}

// Interface guards
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.Validator    = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)
