package selection

import (
	"sync"
	"sync/atomic"
	"time"
)

// RemoteBookings are other replicas' bookings, applied as load on this
// router's ranks (docs/replicas.md): a remote booking adds its prefill
// tokens, its request and its active blocks to the rank exactly as a local
// one does, so selection scores the fleet's load. Each is owned by the
// replica (origin) that made it, which alone frees it; when the origin
// goes silent its caller drops them all (DropOrigin).
//
// Lock order: RemoteBookings.mu comes before Catalog.mu, partition.mu and
// affinityTable.mu, and after Catalog.writeMu (forgetServer runs under
// it). Nothing takes RemoteBookings.mu while holding one of the others.
type RemoteBookings struct {
	catalog  *Catalog
	cfg      *liveConfig
	affinity *affinityTable
	now      func() time.Time

	mu      sync.Mutex
	origins map[string]map[string]*booking // origin → selection id → booking
	blocks  map[string]int                 // origin → prompt blocks its bookings hold
	// maxBlocks bounds blocks per origin (0: no bound): its bookings'
	// hashes are kept here, and a count of bookings alone let one origin
	// hold 65,536 of 4,096 blocks each (2 GiB).
	maxBlocks int
	// bookings and allBlocks are the table's totals, all origins together,
	// which maxOriginsInFull bounds.
	bookings, allBlocks int
	// evicted counts bookings evicted to make an origin its fair share of
	// a full table (makeRoom); hog is the origin makeRoom evicts from, by
	// blocks or by bookings, until it is down to its share.
	evicted     atomic.Uint64
	hog         string
	hogByBlocks bool
}

// maxOriginsInFull bounds the table as a whole: at most this many
// origins' worth of bookings and blocks at their per-origin bounds. Each
// origin's bound alone let 256 origins (maxPeers) hold 256 times one's
// (some 9.7 GB at the defaults); a fleet's live bookings are far under
// one origin's bound each.
const maxOriginsInFull = 8

// SetMaxBlocksPerOrigin bounds the prompt blocks one origin's bookings may
// hold here (0: no bound); a booking past it is RemoteOverBound.
func (m *RemoteBookings) SetMaxBlocksPerOrigin(n int) {
	m.mu.Lock()
	m.maxBlocks = n
	m.mu.Unlock()
}

// RemoteOutcome is what became of a remote reservation.
type RemoteOutcome int

const (
	// RemoteApplied: the booking now counts on its rank.
	RemoteApplied RemoteOutcome = iota
	// RemoteDuplicate: the origin already holds a booking with this id
	// (a re-announcement); nothing changed.
	RemoteDuplicate
	// RemoteUnknownRank: this router has no such schedulable rank (its
	// catalog differs, or the worker left); dropped.
	RemoteUnknownRank
	// RemoteOverBound: the origin holds the most bookings allowed; dropped.
	RemoteOverBound
)

func newRemoteBookings(c *Catalog, cfg *liveConfig, aff *affinityTable, now func() time.Time) *RemoteBookings {
	return &RemoteBookings{catalog: c, cfg: cfg, affinity: aff, now: now, origins: map[string]map[string]*booking{}, blocks: map[string]int{}}
}

// Remote is the table of other replicas' bookings.
func (r *Router) Remote() *RemoteBookings { return r.remote }

// Reserve applies origin's booking rec, unless origin already holds
// maxPerOrigin bookings (0: no bound). rec.Hashes is kept: the caller
// must not modify it afterwards.
func (m *RemoteBookings) Reserve(origin string, rec *BookingRecord, maxPerOrigin int) RemoteOutcome {
	m.mu.Lock()
	defer m.mu.Unlock()
	mine := m.origins[origin]
	if _, ok := mine[rec.ID]; ok {
		return RemoteDuplicate
	}
	if maxPerOrigin > 0 && len(mine) >= maxPerOrigin ||
		m.maxBlocks > 0 && m.blocks[origin]+len(rec.Hashes) > m.maxBlocks {
		return RemoteOverBound
	}
	p := m.catalog.partition(rec.Partition.withDefaults())
	if p == nil || !p.hasRank(rec.Rank) {
		return RemoteUnknownRank
	}
	// Room is made once the booking is known to apply: a booking for a
	// rank this router lacks evicted another's and then took nothing.
	if !m.makeRoom(origin, len(rec.Hashes), maxPerOrigin) {
		return RemoteOverBound
	}
	cfg := m.cfg.get()
	p.mu.Lock()
	rs := p.byRank[rec.Rank]
	if rs == nil {
		p.mu.Unlock()
		return RemoteUnknownRank // left meanwhile
	}
	b := &booking{id: rec.ID, key: p.key, part: p, rs: rs, hashes: rec.Hashes, prefill: rec.PrefillTokens,
		client: origin, createdAt: m.now()}
	p.load.add(b, cfg.TrackActiveBlocks)
	if rec.Outputs > 0 {
		b.outputs, b.outWeight = rec.Outputs, float64(rec.Outputs)
		rs.decodeWeight += float64(rec.Outputs)
	}
	p.mu.Unlock()
	if rec.Session != "" && m.affinity.enabled() {
		if b.lease = m.affinity.adopt(sessionKey{p.key, rec.Session}, rec.Rank); b.lease != nil {
			b.session = rec.Session
		}
	}
	if mine == nil {
		mine = map[string]*booking{}
		m.origins[origin] = mine
	}
	mine[rec.ID] = b
	m.blocks[origin] += len(b.hashes)
	m.bookings, m.allBlocks = m.bookings+1, m.allBlocks+len(b.hashes)
	return RemoteApplied
}

// PrefillCompleted marks origin's booking id prefilled; false when unknown.
func (m *RemoteBookings) PrefillCompleted(origin, id string) bool {
	return m.onBooking(origin, id, func(b *booking) { b.part.load.prefillComplete(b) })
}

// OutputBlock adds an output block to origin's booking id; false when
// unknown or when the decay fraction is out of [0, 1].
func (m *RemoteBookings) OutputBlock(origin, id string, decay *float64) bool {
	if decay != nil && !(*decay >= 0 && *decay <= 1) {
		return false
	}
	track := m.cfg.get().TrackActiveBlocks
	return m.onBooking(origin, id, func(b *booking) { b.part.load.outputBlock(b, decay, track) })
}

func (m *RemoteBookings) onBooking(origin, id string, fn func(b *booking)) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.origins[origin][id]
	if b == nil {
		return false
	}
	b.part.mu.Lock()
	if !b.freed {
		fn(b)
	}
	b.part.mu.Unlock()
	return true
}

// Free releases origin's booking id; false when unknown.
func (m *RemoteBookings) Free(origin, id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.origins[origin][id]
	if b == nil {
		return false
	}
	m.dropLocked(origin, id, b)
	return true
}

// dropLocked takes origin's booking id, b, out of the table and off its
// rank; m.mu is held.
func (m *RemoteBookings) dropLocked(origin, id string, b *booking) {
	delete(m.origins[origin], id)
	if len(m.origins[origin]) == 0 {
		delete(m.origins, origin)
	}
	m.releaseLocked(origin, b)
}

// DropOrigin releases every booking of origin (it went silent, restarted
// or re-announces) and returns how many there were.
func (m *RemoteBookings) DropOrigin(origin string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	mine := m.origins[origin]
	delete(m.origins, origin)
	for _, b := range mine {
		m.releaseLocked(origin, b)
	}
	return len(mine)
}

// DropAll releases every remote booking (this replica routes alone).
func (m *RemoteBookings) DropAll() int {
	m.mu.Lock()
	origins := make([]string, 0, len(m.origins))
	for o := range m.origins {
		origins = append(origins, o)
	}
	m.mu.Unlock()
	n := 0
	for _, o := range origins {
		n += m.DropOrigin(o)
	}
	return n
}

// Evicted is the number of bookings evicted so that an origin under its
// fair share of the full table could book (makeRoom).
func (m *RemoteBookings) Evicted() uint64 { return m.evicted.Load() }

// Counts is the number of bookings each origin holds here.
func (m *RemoteBookings) Counts() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	counts := make(map[string]int, len(m.origins))
	for o, mine := range m.origins {
		counts[o] = len(mine)
	}
	return counts
}

// Count is the number of bookings origin holds here.
func (m *RemoteBookings) Count(origin string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.origins[origin])
}

// Total is the number of remote bookings held, all origins together.
func (m *RemoteBookings) Total() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bookings
}

// forgetWorker releases the remote bookings on a worker whose endpoint now
// names another server (Router.forgetServer).
func (m *RemoteBookings) forgetWorker(id uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for origin, mine := range m.origins {
		for sid, b := range mine {
			if b.rs.rank.WorkerID == id {
				delete(mine, sid)
				m.releaseLocked(origin, b)
			}
		}
		if len(mine) == 0 {
			delete(m.origins, origin)
		}
	}
}

// releaseLocked takes origin's booking b off its rank; m.mu is held.
func (m *RemoteBookings) releaseLocked(origin string, b *booking) {
	if m.blocks[origin] -= len(b.hashes); m.blocks[origin] <= 0 {
		delete(m.blocks, origin)
	}
	m.bookings, m.allBlocks = m.bookings-1, m.allBlocks-len(b.hashes)
	p := b.part
	p.mu.Lock()
	p.load.free(b, m.cfg.get().TrackActiveBlocks)
	p.mu.Unlock()
	if b.session != "" {
		m.affinity.release(sessionKey{b.key, b.session}, b.lease)
	}
}

// adopt takes a lease for a booking another replica dispatched to r: the
// binding follows it, whatever the mode (the dispatch has happened; a hard
// refusal belongs to the replica that made it). It returns the binding
// leased, nil when none was (the table is full).
func (a *affinityTable) adopt(k sessionKey, r Rank) *binding {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.liveBinding(k, now)
	if b == nil {
		// Other replicas' sessions take at most half the table, so that a
		// peer's bookings (a peer's bound is 65,536, as the table's) leave
		// this replica's own sessions room to bind.
		return a.bindNew(k, r, true)
	}
	b.rank = r
	b.leases++
	return b
}

// peerShare is how many of a table of capacity bindings other replicas'
// bookings may make.
func peerShare(capacity int) int { return max(capacity/2, 1) }
