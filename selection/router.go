package selection

import (
	"errors"
	"net/http"
	"sync"
	"time"
)

// Router is the selection engine. It composes the small types that hold
// its concerns and keeps the request-facing calls (select, book, free):
//
//   - Catalog: workers, partitions, the catalog version, hooks and the
//     endpoint check (Catalog()).
//   - Health: failure reports, the down sweep and its probes (Health()).
//   - bookings: the reservation table, per-client bounds and the stale
//     sweep.
//   - selector: normalise, score and choose, and booking the choice; it
//     holds the pending selections and session affinity with bookings.
//   - Queries: read-only loads, scores and the index dump (Queries()).
//
// It is safe for concurrent use. Go programs embed it directly;
// api.Handler (package selection/api) serves it over HTTP with Dynamo's
// wire format.
//
// Lock order: a goroutine takes these only in this order, so none waits
// for a lock held by one that waits for its own:
//
//	Reservation.mu → Catalog.writeMu → Catalog.mu → partition.mu → affinityTable.mu
//
// A Reservation holds its mu across its calls into the router, so each
// of its effects happens once. The index's own locks are never taken
// under Catalog.mu or partition.mu (under Catalog.writeMu they are: a
// write drops a worker's entries).
// bookings.mu, Health.mu and the pending cache's mu are leaves: nothing
// else is locked while one is held. Catalog hooks run under
// Catalog.writeMu (after Catalog.mu is released); the endpoint check
// runs outside every lock.
type Router struct {
	cfg   *liveConfig
	now   func() time.Time
	index Indexer

	catalog  *Catalog
	health   *Health
	queries  *Queries
	sel      *selector
	book     *bookings
	pending  *pendingCache
	affinity *affinityTable // nil when session affinity is off
	// probeHeader is WithProbeHeader's, for the health probes.
	probeHeader http.Header
	// selectTiming is WithSelectTiming's hook, nil without it.
	selectTiming func(SelectTiming)

	remote *RemoteBookings // other replicas' bookings (replica_remote.go)
	// approxShare wraps the approximate index's recorder for the other
	// replicas (replica_approx.go); nil in event mode.
	approxShare *sharingRecorder

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// Option customises a Router.
type Option func(*Router)

// WithIndexer makes the router read overlaps from idx (the event-fed KV
// index). Without it, a router with UseKVEvents off uses an ApproxIndex.
func WithIndexer(idx Indexer) Option { return func(r *Router) { r.index = idx } }

// WithProbeHeader sends a header with every health probe (GET /health on
// a worker that was taken out): the gateway's loop mark, so that a
// worker whose endpoint leads back to the gateway is refused at once.
func WithProbeHeader(name, value string) Option {
	return func(r *Router) { r.probeHeader = http.Header{http.CanonicalHeaderKey(name): {value}} }
}

// WithClock replaces time.Now, for tests of expiry.
func WithClock(now func() time.Time) Option { return func(r *Router) { r.now = now } }

// WithCatalogHook calls fn after every catalog change with the record before
// (nil when new) and after (nil when deleted). Listeners and upstream
// sources use it to follow the catalog. fn must not call back into the
// catalog methods.
func WithCatalogHook(fn func(old, cur *WorkerRecord)) Option {
	return func(r *Router) { r.catalog.hooks = append(r.catalog.hooks, fn) }
}

// NewRouter builds a router. It starts a goroutine that sweeps stale
// reservations and session bindings and, with WorkerDownAfter, one that
// sweeps worker health; Close stops them.
func NewRouter(cfg Config, opts ...Option) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Router{cfg: newLiveConfig(cfg), now: time.Now, stop: make(chan struct{})}
	// The catalog exists before the options run: two of them configure it.
	r.catalog = newCatalog(r.cfg)
	for _, o := range opts {
		o(r)
	}
	if r.index == nil {
		if cfg.UseKVEvents {
			return nil, errors.New("use_kv_events needs an event-fed indexer (selection.WithIndexer); set use_kv_events false for the approximate mode")
		}
		r.index = NewApproxIndex(cfg.ApproxTTL)
	}
	var recorder BookingRecorder // non-nil when bookings feed the index
	if rec, ok := r.index.(BookingRecorder); ok && !cfg.UseKVEvents {
		r.approxShare = &sharingRecorder{inner: rec} // tells the other replicas (replica_approx.go)
		recorder = r.approxShare
	}
	if ai, ok := r.index.(*ApproxIndex); ok {
		ai.now = r.now
	}
	r.pending = newPendingCache(cfg.PendingTTL, cfg.PendingMaxEntries, cfg.PendingMaxBytes, r.now)
	if cfg.SessionAffinityTTL > 0 {
		r.affinity = newAffinityTable(cfg.SessionAffinityTTL, cfg.SessionAffinitySoft, cfg.SessionTableCap, r.now)
	}
	r.catalog.index, r.catalog.forget = r.index, r.forgetServer
	r.health = &Health{cfg: r.cfg, now: r.now, catalog: r.catalog, probeHeader: r.probeHeader}
	r.book = newBookings(r.cfg, r.now, r.affinity)
	r.remote = newRemoteBookings(r.catalog, r.cfg, r.affinity, r.now)
	r.sel = &selector{cfg: r.cfg, index: r.index, recorder: recorder, catalog: r.catalog,
		book: r.book, pending: r.pending, affinity: r.affinity, timing: r.selectTiming}
	r.queries = &Queries{catalog: r.catalog, sel: r.sel, index: r.index, cfg: r.cfg}
	// Each sweep reads its interval from the configuration in force, so a
	// Reconfigure that changes ReservationTTL or WorkerDownAfter changes
	// them too. Health has its own timer, so probes never delay the
	// reservation sweep (and with WorkerDownAfter 0 its sweep does nothing).
	r.wg.Go(func() {
		repeat(r.stop, func() time.Duration { return bookingSweepEvery(r.cfg.get().ReservationTTL) }, func() { r.book.sweep() })
	})
	r.wg.Go(func() {
		repeat(r.stop, func() time.Duration { return healthSweepEvery(r.cfg.get().WorkerDownAfter) }, r.health.sweep)
	})
	return r, nil
}

// Catalog is the router's worker catalog: registrations, lookups and
// readiness (GET/POST/PATCH/DELETE /workers, GET /ready).
func (r *Router) Catalog() *Catalog { return r.catalog }

// Health is where callers report upstream answers and read which workers
// are down.
func (r *Router) Health() *Health { return r.health }

// Queries answers the read-only questions: loads, potential loads,
// overlap scores and the index dump.
func (r *Router) Queries() *Queries { return r.queries }

// Config returns the router's configuration.
func (r *Router) Config() Config { return *r.cfg.get() }

// Close stops the background sweepers. The router stays usable for reads.
func (r *Router) Close() {
	r.stopOnce.Do(func() { close(r.stop) })
	r.wg.Wait()
}

// repeat calls fn every interval until stop closes (Close); the router
// runs it on its own goroutines (r.wg).
func repeat(stop <-chan struct{}, every func() time.Duration, fn func()) {
	t := time.NewTimer(every())
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			fn()
			t.Reset(every())
		}
	}
}

// Sweep force-frees bookings older than ReservationTTL, drops idle
// session bindings, and takes out (or brings back) unreachable workers.
// It runs periodically (health more often: a tenth of WorkerDownAfter);
// tests call it directly. It returns the number of bookings freed.
func (r *Router) Sweep() int {
	n := r.book.sweep()
	r.health.sweep()
	return n
}

// Select picks a rank without booking load (docs/selection-api.md,
// "Selecting"). With a selection_id the pick is cached so
// CreateReservation can book it by id.
func (r *Router) Select(req *SelectRequest) (*SelectResponse, error) {
	return r.sel.selectRequest(req, false, false)
}

// SelectAndReserve picks a rank and books the request on it atomically
// (docs/selection-api.md, "Selecting"). The booking is keyed by
// selection_id, a UUIDv4 if absent.
func (r *Router) SelectAndReserve(req *SelectRequest) (*SelectResponse, error) {
	return r.sel.selectRequest(req, true, false)
}

// SelectAndReserveExplained is SelectAndReserve with the per-candidate
// breakdown filled in resp.Candidates (for the proxy's explain output).
func (r *Router) SelectAndReserveExplained(req *SelectRequest) (*SelectResponse, error) {
	return r.sel.selectRequest(req, true, true)
}

// CreateReservation books a request (docs/selection-api.md,
// "Reservations"): from the pending cache when only selection_id is
// given, or explicitly on worker_id/dp_rank.
func (r *Router) CreateReservation(req *ReservationRequest) (*ReservationResponse, error) {
	return r.sel.reserve(req)
}

// PrefillComplete marks the booking's prefill done (idempotent).
func (r *Router) PrefillComplete(id string) error { return r.book.prefillComplete(id) }

// AddOutputBlock adds one output block to the booking's rank; a decay
// fraction in [0, 1] re-weights the blocks the booking holds alone.
func (r *Router) AddOutputBlock(id string, decayFraction *float64) error {
	return r.book.outputBlock(id, decayFraction)
}

// Free releases a booking: prefill tokens, blocks and the request count.
func (r *Router) Free(id string) error { return r.book.free(id) }

// ActiveReservations is the number of live bookings.
func (r *Router) ActiveReservations() int { return r.book.active() }

// forgetServer drops what the router knows of the server behind old's
// endpoint, as if the worker had been deleted: its index entries, its
// bookings (their load and their ids), its sessions' bindings, the
// selections pending on it and its failure history. A worker whose
// endpoint changes is another server: none of this is true of it, and
// keeping its cached prefixes would send its sessions' next turns (and
// their context) to whoever registered the new endpoint. The catalog
// calls it (Catalog.forget) under its write lock.
func (r *Router) forgetServer(old *WorkerRecord) {
	id := old.WorkerID
	r.index.RemoveWorker(old.Partition(), id)
	r.book.forgetWorker(id)
	r.remote.forgetWorker(id)
	if r.affinity.enabled() {
		r.affinity.forgetWorker(id)
	}
	r.pending.dropWorker(id)
	r.health.forget(id)
}
