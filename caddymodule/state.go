package caddymodule

import (
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/indexer"
	"github.com/kvrouter/caddy-kvrouter/selection"
)

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

// routerState is the pooled value: the router, the KV-event listeners that
// feed its index (with use_kv_events), and what the configs that shared it
// have declared. Listeners belong to it, so a reload neither drops nor
// duplicates them.
type routerState struct {
	router  *selection.Router
	events  *indexer.Manager // nil without use_kv_events
	created eventSettings    // what the index and listeners were built with
	logger  *zap.Logger

	mu         sync.Mutex
	fromConfig map[uint64]struct{} // worker ids declared by the latest config
	generation int                 // configs that have applied their workers to this router

	applied appliedConfigs // whose settings and workers the router holds (applied.go)
}

// syncWorkers upserts the declared workers and deletes those an earlier
// config declared and this one does not. It returns how many configs have
// applied their workers to the router, this one included.
//
// Upserts run before deletions, so a rejected upsert leaves the workers of
// the previous config in place; the ones upserted before it stay and are
// remembered as declared, so that a later config can remove them.
func (s *routerState) syncWorkers(reqs []*selection.WorkerRequest, logger *zap.Logger) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.generation++
	next := make(map[uint64]struct{}, len(reqs))
	// A declared worker's endpoint is its own: a worker discovery made
	// there meanwhile (while a config without the declaration ran) gives
	// way. Left, both took the engine's traffic, or, the catalog full, the
	// declaration was refused and the config could not be loaded again.
	declared := make(map[string]bool, len(reqs))
	for _, req := range reqs {
		if req.Endpoint != nil {
			declared[canonicalEndpoint(*req.Endpoint)] = true
		}
	}
	ledger := ledgerFor(s.router.Catalog())
	ledger.yield(s.router.Catalog(), declared, logger.Named("discovery"))
	for _, req := range reqs {
		if _, err := s.router.Catalog().UpsertWorker(req); err != nil {
			for id := range next {
				s.fromConfig[id] = struct{}{}
			}
			ledger.resolveAgain() // what gave way for the refused declarations comes back now
			return s.generation, fmt.Errorf("worker %d: %v", *req.WorkerID, err)
		}
		next[*req.WorkerID] = struct{}{}
	}
	for id := range s.fromConfig {
		if _, keep := next[id]; keep {
			continue
		}
		// Not found means the worker was already deleted through the API.
		if _, err := s.router.Catalog().DeleteWorker(id); err == nil {
			logger.Info("deleted worker removed from the config", zap.Uint64("worker_id", id))
		}
	}
	s.fromConfig = next
	return s.generation, nil
}

// newRouterState builds the router and, in event mode, the index and the
// listener manager that follows the router's catalog.
func newRouterState(cfg selection.Config, created eventSettings, limits eventLimits, logger *zap.Logger) (*routerState, error) {
	bind := created.KVEventsBind
	s := &routerState{fromConfig: map[uint64]struct{}{}, created: created, logger: logger}
	opts := []selection.Option{selection.WithEndpointCheck(newSelfGuard().check), selection.WithSelectTiming(observeSelectTiming),
		selection.WithProbeHeader(viaHeader, processID)}
	if cfg.UseKVEvents {
		idx := indexer.New()
		idx.MaxEntries = limits.maxEntries
		idx.IngestCores = limits.ingestCores
		peers, err := bindPeers(created.KVEventsBindPeers)
		if err != nil {
			return nil, err
		}
		m, err := indexer.NewManager(idx, logger.Named("kv_events"), append(limits.manager, indexer.WithBindPeers(peers))...)
		if err != nil {
			return nil, fmt.Errorf("kv events: %v", err)
		}
		s.events = m
		opts = append(opts, selection.WithIndexer(m.Index), selection.WithCatalogHook(m.OnCatalogChange))
	} else {
		// Bookings feed this index: without a bound, the rate of new
		// prompts (or of other replicas' records) times approx_ttl is
		// what it holds.
		ai := selection.NewApproxIndex(cfg.ApproxTTL)
		ai.SetMaxMemory(limits.approxHeap)
		opts = append(opts, selection.WithIndexer(ai))
	}
	r, err := selection.NewRouter(cfg, opts...)
	if err != nil {
		if s.events != nil {
			_ = s.events.Close()
		}
		return nil, err
	}
	s.router = r
	r.Health().OnChange(healthChanged(logger.Named("health")))
	if bind != "" {
		// The catalog's hosts, so that a connection from any other
		// address is closed before it can hold a place (topicguard.go).
		b, err := s.events.Bind(bind, indexer.ResolverFor(r), indexer.WithWorkerHosts(indexer.HostsFor(r)))
		if err != nil {
			_ = s.Destruct()
			return nil, err
		}
		logger.Info("receiving kv events", zap.String("bind", b.Endpoint()))
	}
	return s, nil
}

// destructTimeout bounds how long unloading the router may hold up the
// config load that unloads it.
const destructTimeout = 10 * time.Second

// Destruct stops the router's background work and the KV-event listeners
// when the last config that used them is unloaded. It runs inside a config
// load, and Caddy serializes loads: a close that never finished would
// wedge every later load and reload of the gateway. So it waits at most
// destructTimeout; past that the load goes on, the close keeps going in
// the background, and the log has every goroutine's stack to say where it
// was stuck.
func (s *routerState) Destruct() error {
	done := make(chan error, 1)
	go func() {
		s.router.Close()
		var err error
		if s.events != nil {
			err = s.events.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(destructTimeout):
		stacks := make([]byte, 1<<20)
		stacks = stacks[:runtime.Stack(stacks, true)]
		s.logger.Error("closing the kv_router state is taking longer than the config load may wait; going on without it",
			zap.Duration("waited", destructTimeout), zap.ByteString("goroutines", stacks))
		return fmt.Errorf("closing the kv_router state took more than %v", destructTimeout)
	}
}

// Interface guards
var _ caddy.Destructor = (*routerState)(nil)

// eventSettings are the app's settings that shape the KV index and its
// listeners, which are built once with the router: a reload that changes
// them takes effect when Caddy restarts. Each field is named as its
// kv_router option.
type eventSettings struct {
	KVEventsBind       string
	KVEventsBindPeers  string
	IndexMaxEntries    int64
	IndexMaxMemory     int64
	KVEventsMaxMessage int64
	KVEventsMaxGap     uint64
	KVEventsCores      int
	KVEventsMaxPeers   int
}

// eventSettings are this config's.
func (a *App) eventSettings() eventSettings {
	return eventSettings{a.KVEventsBind, a.KVEventsBindPeers, a.IndexMaxEntries, a.IndexMaxMemory, a.KVEventsMaxMessage, a.KVEventsMaxGap, a.KVEventsCores, a.KVEventsMaxPeers}
}

// bindPeers reads kv_events_bind_peers ("" is its default, worker_host).
func bindPeers(s string) (indexer.BindPeers, error) {
	switch s {
	case "", "worker_host":
		return indexer.PeersWorkerHost, nil
	case "any":
		return indexer.PeersAny, nil
	}
	return 0, fmt.Errorf("kv_events_bind_peers %q: worker_host or any", s)
}
