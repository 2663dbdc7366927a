package selection

import (
	"fmt"
	"testing"
	"time"
)

// TestPeerSessionsTakeHalfTheTable: other replicas' bookings bind at most
// half the session table, so a peer sending bookings for 65,536 sessions
// (its bound) leaves this replica's own sessions room to bind; they used
// to take every place. A peer's binding leased here becomes this
// replica's own and frees its place in the peers' half; an expired one
// frees it too.
func TestPeerSessionsTakeHalfTheTable(t *testing.T) {
	now := time.Unix(1000, 0)
	a := newAffinityTable(time.Minute, true, 8, func() time.Time { return now })
	part := PartitionKey{"m", "g"}
	key := func(s string) sessionKey { return sessionKey{part, s} }
	adopted := 0
	leases := map[int]*binding{}
	for i := range 8 {
		if l := a.adopt(key(fmt.Sprint("peer-", i)), Rank{WorkerID: 1}); l != nil {
			adopted++
			leases[i] = l
		}
	}
	if adopted != 4 || a.byPeers != 4 {
		t.Fatalf("a peer's 8 sessions bound %d (counted %d), want 4", adopted, a.byPeers)
	}
	for i := range 4 {
		if leased, err := a.acquire(key(fmt.Sprint("own-", i)), Rank{WorkerID: 2}); leased == nil || err != nil {
			t.Fatalf("own session %d not bound beside the peer's: %v %v", i, leased, err)
		}
	}
	// Leased here, a peer's binding is this replica's own.
	if leased, err := a.acquire(key("peer-0"), Rank{WorkerID: 1}); leased == nil || err != nil || a.byPeers != 3 {
		t.Fatalf("leasing a peer's session: %v %v, peers' bindings %d, want 3", leased, err, a.byPeers)
	}
	// Released and expired, the peers' bindings free their places.
	for i := 1; i < 4; i++ {
		a.release(key(fmt.Sprint("peer-", i)), leases[i])
	}
	now = now.Add(2 * time.Minute)
	a.sweep()
	if a.byPeers != 0 {
		t.Fatalf("after the sweep, %d peers' bindings counted", a.byPeers)
	}
	if a.adopt(key("peer-new"), Rank{WorkerID: 1}) == nil {
		t.Fatal("a peer's session was refused with the peers' half free")
	}
}

// TestLeaseOfADroppedBindingIsNotTheNewOnes: a session's binding dropped
// while its bookings still run (its worker left, or a turn outgrew the
// worker's context) is made again for the rank the next request went to.
// The old bookings' releases counted against the new binding's leases, so
// it went idle, and expired, while its own booking still ran.
func TestLeaseOfADroppedBindingIsNotTheNewOnes(t *testing.T) {
	now := time.Unix(1000, 0)
	a := newAffinityTable(time.Minute, false, 8, func() time.Time { return now })
	k := sessionKey{PartitionKey{"m", "g"}, "conv"}
	old1, _ := a.acquire(k, Rank{WorkerID: 1})
	old2, _ := a.acquire(k, Rank{WorkerID: 1})
	a.forget(k)
	current, err := a.acquire(k, Rank{WorkerID: 2})
	if current == nil || err != nil {
		t.Fatalf("the session was not bound again: %v", err)
	}
	a.release(k, old1)
	a.release(k, old2)
	now = now.Add(2 * time.Minute)
	if r, ok := a.bound(k); !ok || r.WorkerID != 2 {
		t.Fatalf("with its booking still running, the session is bound to %v (%v), want worker 2", r, ok)
	}
	a.release(k, current)
	now = now.Add(2 * time.Minute)
	if _, ok := a.bound(k); ok {
		t.Fatal("the binding outlived its idle time")
	}
}
