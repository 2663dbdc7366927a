package selection

import (
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Router is the selection engine: catalog, load accounting, cost function,
// reservations, pending selections and session affinity. It is safe for
// concurrent use. Go programs embed it directly; api.Handler (package
// selection/api) serves it over HTTP with Dynamo's wire format.
type Router struct {
	cfg      Config
	now      func() time.Time
	index    Indexer
	recorder BookingRecorder // non-nil when bookings feed the index
	hooks    []func(old, cur *WorkerRecord)
	// endpointCheck vets new worker endpoints (WithEndpointCheck).
	endpointCheck func(endpoint string) error

	catalogMu sync.Mutex    // serializes catalog updates, so they commit in order
	version   atomic.Uint64 // bumped on every catalog change
	mu        sync.RWMutex
	workers   map[uint64]*WorkerRecord
	parts     map[PartitionKey]*partition
	ranks     int // data-parallel ranks over workers, for MaxRanks

	resMu        sync.Mutex
	reservations map[string]*booking // nil value: claimed, booking in flight
	clients      map[string]int      // live and claimed bookings per client

	pending  *pendingCache
	affinity *affinityTable
	health   healthTable

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// partition is one (model, group): its settings, ranks and load.
type partition struct {
	key       PartitionKey
	blockSize uint32
	isEagle   bool

	mu     sync.Mutex
	ranks  []*rankState // schedulable ranks sorted by (worker, dp_rank)
	byRank map[Rank]*rankState
	load   loadTracker
}

// Option customises a Router.
type Option func(*Router)

// WithIndexer makes the router read overlaps from idx (the event-fed KV
// index). Without it, a router with UseKVEvents off uses an ApproxIndex.
func WithIndexer(idx Indexer) Option { return func(r *Router) { r.index = idx } }

// WithClock replaces time.Now, for tests of expiry.
func WithClock(now func() time.Time) Option { return func(r *Router) { r.now = now } }

// WithCatalogHook calls fn after every catalog change with the record before
// (nil when new) and after (nil when deleted). Listeners and upstream
// sources use it to follow the catalog. fn must not call back into the
// catalog methods.
func WithCatalogHook(fn func(old, cur *WorkerRecord)) Option {
	return func(r *Router) { r.hooks = append(r.hooks, fn) }
}

// NewRouter builds a router. It starts a goroutine that sweeps stale
// reservations and session bindings and, with WorkerDownAfter, one that
// sweeps worker health; Close stops them.
func NewRouter(cfg Config, opts ...Option) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Router{
		cfg:          cfg,
		now:          time.Now,
		workers:      make(map[uint64]*WorkerRecord),
		parts:        make(map[PartitionKey]*partition),
		reservations: make(map[string]*booking),
		clients:      make(map[string]int),
		stop:         make(chan struct{}),
	}
	for _, o := range opts {
		o(r)
	}
	if r.index == nil {
		if cfg.UseKVEvents {
			return nil, errors.New("use_kv_events needs an event-fed indexer (selection.WithIndexer); set use_kv_events false for the approximate mode")
		}
		r.index = NewApproxIndex(cfg.ApproxTTL)
	}
	if rec, ok := r.index.(BookingRecorder); ok && !cfg.UseKVEvents {
		r.recorder = rec
	}
	if ai, ok := r.index.(*ApproxIndex); ok {
		ai.now = r.now
	}
	r.pending = newPendingCache(cfg.PendingTTL, cfg.PendingMaxEntries, cfg.PendingMaxBytes, r.now)
	if cfg.SessionAffinityTTL > 0 {
		r.affinity = newAffinityTable(cfg.SessionAffinityTTL, cfg.SessionAffinitySoft, cfg.SessionTableCap, r.now)
	}
	r.wg.Add(1)
	go r.repeat(bookingSweepEvery(cfg.ReservationTTL), func() { r.sweepBookings() })
	if cfg.WorkerDownAfter > 0 {
		// Health has its own ticker, so probes never delay the
		// reservation sweep.
		r.wg.Add(1)
		go r.repeat(healthSweepEvery(cfg.WorkerDownAfter), r.sweepHealth)
	}
	return r, nil
}

// CatalogVersion changes whenever the catalog does, so callers can cache
// what they derive from it (reverse_proxy's upstream list).
func (r *Router) CatalogVersion() uint64 { return r.version.Load() }

// Config returns the router's configuration.
func (r *Router) Config() Config { return r.cfg }

// Close stops the background sweepers. The router stays usable for reads.
func (r *Router) Close() {
	r.stopOnce.Do(func() { close(r.stop) })
	r.wg.Wait()
}

// bookingSweepEvery is how often stale bookings are swept: every 30
// seconds, or twice per ReservationTTL when that is shorter.
func bookingSweepEvery(ttl time.Duration) time.Duration {
	every := 30 * time.Second
	if ttl > 0 && ttl/2 < every {
		every = max(ttl/2, 10*time.Millisecond)
	}
	return every
}

// repeat calls fn every interval until Close; it is one of the router's
// goroutines (r.wg).
func (r *Router) repeat(every time.Duration, fn func()) {
	defer r.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			fn()
		}
	}
}

// Sweep force-frees bookings older than ReservationTTL, drops idle
// session bindings, and takes out (or brings back) unreachable workers.
// It runs periodically (health more often: a tenth of WorkerDownAfter);
// tests call it directly. It returns the number of bookings freed.
func (r *Router) Sweep() int {
	n := r.sweepBookings()
	r.sweepHealth()
	return n
}

// sweepBookings frees stale bookings and drops idle session bindings.
func (r *Router) sweepBookings() int {
	var stale []string
	if r.cfg.ReservationTTL > 0 {
		cutoff := r.now().Add(-r.cfg.ReservationTTL)
		r.resMu.Lock()
		for id, b := range r.reservations {
			if b != nil && b.createdAt.Before(cutoff) {
				stale = append(stale, id)
			}
		}
		r.resMu.Unlock()
	}
	for _, id := range stale {
		_ = r.Free(id)
	}
	if r.affinity.enabled() {
		r.affinity.sweep()
	}
	return len(stale)
}

// ActiveReservations is the number of live bookings.
func (r *Router) ActiveReservations() int {
	r.resMu.Lock()
	defer r.resMu.Unlock()
	n := 0
	for _, b := range r.reservations {
		if b != nil {
			n++
		}
	}
	return n
}

// newSelectionID returns a random UUIDv4.
func newSelectionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// claim reserves a selection id globally (ids are unique across
// partitions) and counts it against client's bound.
func (r *Router) claim(id, client string) error {
	r.resMu.Lock()
	defer r.resMu.Unlock()
	if _, ok := r.reservations[id]; ok {
		return errorf(KindConflict, "selection %s is already reserved or being reserved", id)
	}
	if limit := r.cfg.MaxReservationsPerClient; client != "" && limit > 0 {
		if r.clients[client] >= limit {
			return errorf(KindOverloaded, "client %s holds %d reservations, the most max_reservations_per_client allows; free them (DELETE /reservations/{id}) or wait for them to expire",
				client, limit)
		}
		r.clients[client]++
	}
	r.reservations[id] = nil
	return nil
}

// commit stores the booking under its claimed id. b.client must be the
// client the id was claimed for.
func (r *Router) commit(id string, b *booking) {
	r.resMu.Lock()
	r.reservations[id] = b
	r.resMu.Unlock()
}

// unclaim gives back a claim whose booking failed.
func (r *Router) unclaim(id, client string) {
	r.resMu.Lock()
	if b, ok := r.reservations[id]; ok && b == nil {
		delete(r.reservations, id)
		r.uncountLocked(client)
	}
	r.resMu.Unlock()
}

// takeLocked removes a committed booking from the table and its client's
// count; r.resMu must be held. The caller releases its load.
func (r *Router) takeLocked(id string) *booking {
	b := r.reservations[id]
	if b != nil {
		delete(r.reservations, id)
		r.uncountLocked(b.client)
	}
	return b
}

func (r *Router) uncountLocked(client string) {
	if client == "" || r.cfg.MaxReservationsPerClient <= 0 {
		return
	}
	if r.clients[client]--; r.clients[client] <= 0 {
		delete(r.clients, client)
	}
}

// lookupBooking returns a committed booking; in-flight and unknown ids are
// not found.
func (r *Router) lookupBooking(id string) (*booking, error) {
	r.resMu.Lock()
	b := r.reservations[id]
	r.resMu.Unlock()
	if b == nil {
		return nil, errorf(KindNotFound, "reservation %s not found", id)
	}
	return b, nil
}

// PrefillComplete marks the booking's prefill done (idempotent).
func (r *Router) PrefillComplete(id string) error {
	b, err := r.lookupBooking(id)
	if err != nil {
		return err
	}
	p := b.part
	p.mu.Lock()
	if !b.freed {
		p.load.prefillComplete(b)
	}
	p.mu.Unlock()
	return nil
}

// AddOutputBlock adds one output block to the booking's rank; a decay
// fraction in [0, 1] re-weights the blocks the booking holds alone.
func (r *Router) AddOutputBlock(id string, decayFraction *float64) error {
	if d := decayFraction; d != nil && !(*d >= 0 && *d <= 1) {
		return errorf(KindBadRequest, "decay_fraction must be between 0.0 and 1.0")
	}
	b, err := r.lookupBooking(id)
	if err != nil {
		return err
	}
	p := b.part
	p.mu.Lock()
	if !b.freed {
		p.load.outputBlock(b, decayFraction, r.cfg.TrackActiveBlocks)
	}
	p.mu.Unlock()
	return nil
}

// Free releases a booking: prefill tokens, blocks and the request count.
func (r *Router) Free(id string) error {
	r.resMu.Lock()
	b := r.takeLocked(id)
	r.resMu.Unlock()
	if b == nil {
		return errorf(KindNotFound, "reservation %s not found", id)
	}
	r.release(b)
	return nil
}

// release gives back the load and session lease of a booking already taken
// out of r.reservations.
func (r *Router) release(b *booking) {
	p := b.part
	p.mu.Lock()
	p.load.free(b, r.cfg.TrackActiveBlocks)
	p.mu.Unlock()
	if b.session != "" && r.affinity.enabled() {
		r.affinity.release(sessionKey{b.key, b.session})
	}
}

// partition returns the partition for k, or nil.
func (r *Router) partition(k PartitionKey) *partition {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.parts[k]
}

// schedulablePartition returns k's partition if it has a schedulable rank.
func (r *Router) schedulablePartition(k PartitionKey) (*partition, error) {
	p := r.partition(k)
	if p == nil {
		return nil, errNoSchedulable(k.Model, k.Group)
	}
	p.mu.Lock()
	n := len(p.ranks)
	p.mu.Unlock()
	if n == 0 {
		return nil, errNoSchedulable(k.Model, k.Group)
	}
	return p, nil
}

// sortRanks orders ranks by (worker_id, dp_rank) and renumbers them.
func sortRanks(ranks []*rankState) {
	slices.SortFunc(ranks, func(a, b *rankState) int {
		if a.rank.WorkerID != b.rank.WorkerID {
			if a.rank.WorkerID < b.rank.WorkerID {
				return -1
			}
			return 1
		}
		return int(a.rank.DPRank) - int(b.rank.DPRank)
	})
	for i, rs := range ranks {
		rs.idx = i
	}
}
