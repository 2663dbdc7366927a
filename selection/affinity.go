package selection

import (
	"sync"
	"time"
)

// Session affinity (docs/selection-api.md, "Placement"): a session is bound to the rank its first
// booked request went to. Each live booking of the session holds a lease;
// the binding expires TTL after its last lease is released.

// maxSessionIDBytes bounds session ids, as Dynamo does.
const maxSessionIDBytes = 256

type sessionKey struct {
	part PartitionKey
	id   string
}

type binding struct {
	rank     Rank
	leases   int
	deadline time.Time // idle deadline, meaningful when leases == 0
	// byPeer: made for another replica's booking and not leased here
	// since; such bindings take at most half the table (peerShare).
	byPeer bool
}

type affinityTable struct {
	ttl  time.Duration
	soft bool
	cap  int
	now  func() time.Time

	mu       sync.Mutex
	bindings map[sessionKey]*binding
	byPeers  int // bindings with byPeer set
}

func newAffinityTable(ttl time.Duration, soft bool, capacity int, now func() time.Time) *affinityTable {
	return &affinityTable{ttl: ttl, soft: soft, cap: capacity, now: now, bindings: make(map[sessionKey]*binding)}
}

func (a *affinityTable) enabled() bool { return a != nil && a.ttl > 0 }

// bound returns the rank a session is bound to, if any and still alive.
func (a *affinityTable) bound(k sessionKey) (Rank, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.bindings[k]
	if b == nil || (b.leases == 0 && !b.deadline.After(a.now())) {
		return Rank{}, false
	}
	return b.rank, true
}

// forget drops a binding (its worker left, or a hard-mode violation).
func (a *affinityTable) forget(k sessionKey) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if b := a.bindings[k]; b != nil {
		a.dropLocked(k, b)
	}
}

// dropLocked removes k's binding b. a.mu must be held.
func (a *affinityTable) dropLocked(k sessionKey, b *binding) {
	if b.byPeer {
		a.byPeers--
	}
	delete(a.bindings, k)
}

// forgetWorker drops every binding to a worker's ranks (its endpoint now
// names another server, which holds none of the sessions' context).
func (a *affinityTable) forgetWorker(id uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, b := range a.bindings {
		if b.rank.WorkerID == id {
			a.dropLocked(k, b)
		}
	}
}

// acquire takes a lease for a booking dispatched to r and returns the
// binding leased. In hard mode a dispatch away from the bound rank is
// refused (and the binding dropped); in soft mode the binding follows. A
// full table leaves the session unpinned (no error, but no lease: nil).
func (a *affinityTable) acquire(k sessionKey, r Rank) (lease *binding, err error) {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.liveBinding(k, now)
	if b == nil {
		return a.bindNew(k, r, false), nil
	}
	if b.rank != r {
		if !a.soft {
			a.dropLocked(k, b)
			return nil, errorf(KindBadRequest, "session %s is bound to worker %d dp_rank %d; dispatch to worker %d dp_rank %d rejected",
				k.id, b.rank.WorkerID, b.rank.DPRank, r.WorkerID, r.DPRank)
		}
		b.rank = r
	}
	b.leases++
	if b.byPeer {
		// Leased here too: this replica's own session now.
		b.byPeer = false
		a.byPeers--
	}
	return b, nil
}

// liveBinding returns k's binding, dropping it first when it has expired
// (no lease left and past its idle deadline). a.mu must be held.
func (a *affinityTable) liveBinding(k sessionKey, now time.Time) *binding {
	b := a.bindings[k]
	if b != nil && b.leases == 0 && !b.deadline.After(now) {
		a.dropLocked(k, b)
		return nil
	}
	return b
}

// bindNew binds k, which has no live binding, to r with one lease, for
// another replica's booking when byPeer, unless the table is full (or,
// byPeer, the peers' share of it); it returns the binding, nil when it
// made none. a.mu must be held.
func (a *affinityTable) bindNew(k sessionKey, r Rank, byPeer bool) *binding {
	if len(a.bindings) >= a.cap || byPeer && a.byPeers >= peerShare(a.cap) {
		return nil
	}
	b := &binding{rank: r, leases: 1, byPeer: byPeer}
	a.bindings[k] = b
	if byPeer {
		a.byPeers++
	}
	return b
}

// release gives back a lease of the binding lease; the idle deadline
// starts when the last goes. A lease of a binding since dropped (its
// worker left, or the session's request outgrew it) is given back to
// nothing: the session's new binding counts its own bookings only.
func (a *affinityTable) release(k sessionKey, lease *binding) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if b := a.bindings[k]; b != nil && b == lease && b.leases > 0 {
		b.leases--
		if b.leases == 0 {
			b.deadline = a.now().Add(a.ttl)
		}
	}
}

// sweep drops idle bindings past their deadline.
func (a *affinityTable) sweep() {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, b := range a.bindings {
		if b.leases == 0 && !b.deadline.After(now) {
			a.dropLocked(k, b)
		}
	}
}

func (a *affinityTable) len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.bindings)
}
