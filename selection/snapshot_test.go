package selection

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// snapshotPick runs the first half of a selection: the snapshot under the
// lock and the choice outside it, as selectRequest does.
func snapshotPick(t *testing.T, r *Router, req *SelectRequest, c choice) (*partition, selection, *scoring, *work) {
	t.Helper()
	q, err := r.sel.setupRequest(&req.Partition, nil, &req.Prompt, c.session)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { putWork(q.w) })
	q.p.mu.Lock()
	q.p.snapshot(q.w, c.usesTaints())
	q.p.mu.Unlock()
	sel, err := r.sel.choose(q.p, q.w, &q.s, q.np, c)
	if err != nil {
		t.Fatal(err)
	}
	return q.p, sel, &q.s, q.w
}

// TestStalePickIsRechecked: what changes between the snapshot and the
// booking decides whether the pick still stands. Another rank's load does
// not; the chosen rank's load moving, its going down, filling up,
// leaving, losing a required taint, or the session binding elsewhere does.
func TestStalePickIsRechecked(t *testing.T) {
	prompt := Prompt{TokenIDs: make([]uint32, 64)}
	cases := []struct {
		name    string
		session string
		taints  []string
		change  func(r *Router, p *partition, chosen Rank, other Rank)
		stands  bool
	}{
		{"another rank booked", "", nil, func(r *Router, p *partition, chosen, other Rank) {
			book(t, r, "x", other.WorkerID, other.DPRank, []uint64{1, 2, 3}, 48, 48)
		}, true},
		{"nothing changed", "s", nil, func(*Router, *partition, Rank, Rank) {}, true},
		{"chosen rank booked by another caller", "", nil, func(r *Router, p *partition, chosen, _ Rank) {
			book(t, r, "x", chosen.WorkerID, chosen.DPRank, []uint64{1, 2, 3}, 48, 48)
		}, false},
		{"chosen rank down", "", nil, func(r *Router, p *partition, chosen, _ Rank) {
			p.mu.Lock()
			p.byRank[chosen].down = true
			p.mu.Unlock()
		}, false},
		{"chosen rank full", "", nil, func(r *Router, p *partition, chosen, _ Rank) {
			book(t, r, "x", chosen.WorkerID, chosen.DPRank, []uint64{1}, 16, 16)
		}, false},
		{"chosen worker deleted", "", nil, func(r *Router, p *partition, chosen, _ Rank) {
			if _, err := r.Catalog().DeleteWorker(chosen.WorkerID); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"chosen worker lost a required taint", "", []string{"gpu"}, func(r *Router, p *partition, chosen, _ Rank) {
			addWorker(t, r, chosen.WorkerID, func(w *WorkerRequest) { w.Taints = []string{"cpu"} })
		}, false},
		{"session bound elsewhere", "s", nil, func(r *Router, p *partition, chosen, other Rank) {
			if _, err := r.affinity.acquire(sessionKey{p.key, "s"}, other); err != nil {
				t.Fatal(err)
			}
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRouter(t, func(c *Config) {
				c.MaxReservationsPerRank = 1
				c.SessionAffinityTTL = time.Minute
			})
			for id := uint64(1); id <= 4; id++ {
				addWorker(t, r, id, func(w *WorkerRequest) { w.Taints = []string{"gpu"} })
			}
			req := &SelectRequest{Prompt: prompt}
			if tc.taints != nil {
				req.Placement.RoutingConstraints = &RoutingConstraints{RequiredTaints: tc.taints}
			}
			c := choice{placement: &req.Placement, session: tc.session, book: true}
			p, sel, s, w := snapshotPick(t, r, req, c)
			other := Rank{WorkerID: sel.rs.rank.WorkerID%4 + 1}
			tc.change(r, p, sel.rs.rank, other)
			p.mu.Lock()
			got := r.sel.stillChoosable(p, &sel, c, s, w)
			p.mu.Unlock()
			if got != tc.stands {
				t.Fatalf("stillChoosable = %t, want %t", got, tc.stands)
			}
		})
	}
}

// TestConcurrentBookingsFillEveryRankOnce: with one reservation allowed
// per rank, as many concurrent callers as ranks all book, each on its own
// rank, although they score snapshots taken before the others booked (a
// stale pick of a full rank is made again under the lock, not refused).
func TestConcurrentBookingsFillEveryRankOnce(t *testing.T) {
	const ranks = 512
	r := newTestRouter(t, func(c *Config) { c.MaxReservationsPerRank = 1 })
	for id := uint64(1); id <= ranks; id++ {
		addWorker(t, r, id, nil)
	}
	var (
		mu   sync.Mutex
		got  = map[uint64]int{}
		errs []error
		wg   sync.WaitGroup
	)
	start := make(chan struct{})
	for range ranks {
		wg.Go(func() {
			<-start
			res, err := r.SelectAndReserve(&SelectRequest{Prompt: Prompt{TokenIDs: make([]uint32, 4096)}})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			got[res.WorkerID]++
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d bookings refused, first: %v", len(errs), ranks, errs[0])
	}
	if len(got) != ranks {
		t.Fatalf("booked on %d distinct ranks, want %d: %v", len(got), ranks, got)
	}
	_, err := r.SelectAndReserve(&SelectRequest{Prompt: Prompt{TokenIDs: make([]uint32, 4096)}})
	mustStatus(t, err, 503, "max_reservations_per_rank")
}

// TestStalePickIsMadeAgain: when another caller changes the chosen rank
// between a selection's snapshot and its booking, the selection is made
// again under the lock and books a rank that qualifies now, instead of
// being refused (or booking one it must not).
func TestStalePickIsMadeAgain(t *testing.T) {
	cases := []struct {
		name    string
		session string
		// change runs once, between the choice and the booking, as
		// another caller would.
		change func(t *testing.T, r *Router, chosen, other Rank)
		// wantOther: the selection must end on other (else on any rank
		// but the one chosen first).
		wantOther bool
	}{
		{"chosen rank filled", "", func(t *testing.T, r *Router, chosen, _ Rank) {
			book(t, r, "filler-1", chosen.WorkerID, chosen.DPRank, []uint64{9}, 16, 16)
			book(t, r, "filler-2", chosen.WorkerID, chosen.DPRank, []uint64{9}, 16, 16)
		}, false},
		{"chosen worker deleted", "", func(t *testing.T, r *Router, chosen, _ Rank) {
			if _, err := r.Catalog().DeleteWorker(chosen.WorkerID); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"chosen rank took a long prompt meanwhile", "", func(t *testing.T, r *Router, chosen, _ Rank) {
			// Another caller scoring the same snapshot booked the rank it
			// showed cheapest: this one must not herd onto it.
			book(t, r, "long", chosen.WorkerID, chosen.DPRank, []uint64{9}, 100_000, 100_000)
		}, false},
		{"session bound to another rank", "agent", func(t *testing.T, r *Router, _, other Rank) {
			// Another request of the session books first, on other.
			_, err := r.SelectAndReserve(&SelectRequest{Prompt: Prompt{TokenIDs: make([]uint32, 32)},
				Placement: Placement{SessionID: "agent", PinnedWorker: &PinnedWorker{WorkerID: other.WorkerID}}})
			if err != nil {
				t.Fatal(err)
			}
		}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var timings []SelectTiming
			cfg := DefaultConfig()
			cfg.UseKVEvents = false
			cfg.MaxReservationsPerRank = 2
			cfg.SessionAffinityTTL = time.Minute
			r, err := NewRouter(cfg, WithSelectTiming(func(st SelectTiming) { timings = append(timings, st) }))
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			for id := uint64(1); id <= 4; id++ {
				addWorker(t, r, id, nil)
			}
			var chosen, other Rank
			r.sel.afterChoose = func(sel *selection) {
				r.sel.afterChoose = nil // once: the change's own selections run plainly
				chosen = sel.rs.rank
				other = Rank{WorkerID: chosen.WorkerID%4 + 1}
				tc.change(t, r, chosen, other)
			}
			res, err := r.SelectAndReserve(&SelectRequest{Prompt: Prompt{TokenIDs: make([]uint32, 64)},
				Placement: Placement{SessionID: tc.session}})
			if err != nil {
				t.Fatalf("refused after a stale pick: %v", err)
			}
			got := Rank{res.WorkerID, res.DPRank}
			if got == chosen || tc.wantOther && got != other {
				t.Fatalf("booked %v; the stale pick was %v, the rank that qualifies now %v", got, chosen, other)
			}
			if last := timings[len(timings)-1]; !last.Rechosen {
				t.Fatalf("timing %+v does not say the pick was made again", last)
			}
		})
	}
}

// TestSelectTimingHook: the hook hears every selection that reached its
// partition, with the lock's hold inside the call's wall time.
func TestSelectTimingHook(t *testing.T) {
	var (
		mu      sync.Mutex
		timings []SelectTiming
	)
	cfg := DefaultConfig()
	cfg.UseKVEvents = false
	r, err := NewRouter(cfg, WithSelectTiming(func(st SelectTiming) {
		mu.Lock()
		timings = append(timings, st)
		mu.Unlock()
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// No worker yet: refused before the partition, not timed.
	if _, err := r.SelectAndReserve(&SelectRequest{Prompt: Prompt{TokenIDs: make([]uint32, 64)}}); err == nil {
		t.Fatal("selected with no worker")
	}
	addWorker(t, r, 1, nil)
	for range 3 {
		if _, err := r.SelectAndReserve(&SelectRequest{Prompt: Prompt{TokenIDs: make([]uint32, 4096)}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Select(&SelectRequest{Prompt: Prompt{TokenIDs: make([]uint32, 64)}}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(timings) != 4 {
		t.Fatalf("%d timings, want 4", len(timings))
	}
	for _, st := range timings {
		if st.LockHeld <= 0 || st.LockHeld > st.Total || st.LockWait < 0 || st.Work() != st.Total-st.LockWait || st.Rechosen {
			t.Fatalf("implausible serial timing %+v", st)
		}
	}
}

// TestMovedLoadStandsWhileCheapest: a chosen rank whose load moved after
// the snapshot keeps the pick while it still costs no more than the next
// cheapest rank did (here: it caches the prompt), and loses it once the
// new load outweighs that.
func TestMovedLoadStandsWhileCheapest(t *testing.T) {
	r := newTestRouter(t, nil)
	for id := uint64(1); id <= 4; id++ {
		addWorker(t, r, id, nil)
	}
	tokens := make([]uint32, 4096)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	// The first booking puts the prompt in the (approximate) index.
	first, err := r.SelectAndReserve(&SelectRequest{Prompt: Prompt{TokenIDs: tokens}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Free(first.SelectionID); err != nil {
		t.Fatal(err)
	}
	req := &SelectRequest{Prompt: Prompt{TokenIDs: tokens}}
	c := choice{placement: &req.Placement, book: true}
	p, sel, s, w := snapshotPick(t, r, req, c)
	if sel.rs.rank.WorkerID != first.WorkerID {
		t.Fatalf("picked %v, not the rank holding the prompt (%d)", sel.rs.rank, first.WorkerID)
	}
	stands := func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return r.sel.stillChoosable(p, &sel, c, s, w)
	}
	book(t, r, "small", first.WorkerID, 0, []uint64{1}, 16, 16)
	if !stands() {
		t.Fatal("a 16-token booking on the rank that caches 4,096 tokens of the prompt undid the pick")
	}
	book(t, r, "large", first.WorkerID, 0, []uint64{2}, 100_000, 100_000)
	if stands() {
		t.Fatal("the pick stood after a 100k-token booking made its rank the dearest")
	}
}

// TestActiveForMatchesCountActive: the one-rank trie walk the re-check
// uses agrees with the all-ranks walk the snapshot uses, on random
// bookings sharing prefixes.
func TestActiveForMatchesCountActive(t *testing.T) {
	r := newTestRouter(t, nil)
	for id := uint64(1); id <= 6; id++ {
		addWorker(t, r, id, nil)
	}
	rng := rand.New(rand.NewPCG(3, 3))
	chain := func() []uint64 {
		// Chains share the first blocks often, then diverge.
		h := make([]uint64, 1+rng.IntN(40))
		for i := range h {
			if i < 10 && rng.IntN(4) > 0 {
				h[i] = uint64(i + 1)
			} else {
				h[i] = rng.Uint64()
			}
		}
		return h
	}
	for n := range 200 {
		book(t, r, fmt.Sprint("b", n), uint64(1+rng.IntN(6)), 0, chain(), 16, 16)
		if rng.IntN(3) == 0 {
			_ = r.Free(fmt.Sprint("b", rng.IntN(n+1)))
		}
		p := r.catalog.partition((&Partition{}).Key())
		probe := chain()
		p.mu.Lock()
		hits := make([]uint32, len(p.ranks))
		p.load.countActive(probe, hits)
		for _, rs := range p.ranks {
			if got := p.load.activeFor(probe, rs); got != hits[rs.idx] {
				p.mu.Unlock()
				t.Fatalf("after %d bookings, rank %v: activeFor %d, countActive %d", n+1, rs.rank, got, hits[rs.idx])
			}
		}
		p.mu.Unlock()
	}
}

// TestMovedLoadStandsOnInFlightCredit: with in_flight_overlap, a rank
// chosen because bookings in flight there cover the prompt keeps the pick
// when a small booking moves its load: the re-check prices it with the
// same in-flight credit the scoring loop gave it.
func TestMovedLoadStandsOnInFlightCredit(t *testing.T) {
	r := newTestRouter(t, func(c *Config) {
		c.OverlapScoreCredit = 8
		c.InFlightOverlap = true
		c.UnclippedOverlapCredit = true
	})
	for id := uint64(1); id <= 4; id++ {
		addWorker(t, r, id, nil)
	}
	tokens := make([]uint32, 4096)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	blocks := AppendBlockHashes(nil, tokens, 16, HashOptions{})
	seq := AppendSequenceHashes(nil, blocks)
	// In flight on worker 3, booked by sequence hashes alone: the index
	// learns nothing of it, so only the in-flight credit can draw the pick.
	book(t, r, "ahead", 3, 0, seq, 4096, 16)
	req := &SelectRequest{Prompt: Prompt{BlockHashes: blocks, SequenceHashes: seq, ISLTokens: ptr(uint64(4096))}}
	c := choice{placement: &req.Placement, book: true}
	p, sel, s, w := snapshotPick(t, r, req, c)
	if sel.rs.rank.WorkerID != 3 || sel.runnerUp < 0 {
		t.Fatalf("picked %v (runner-up %v), not worker 3 as the cheapest", sel.rs.rank, sel.runnerUp)
	}
	book(t, r, "small", 3, 0, []uint64{1}, 16, 16)
	p.mu.Lock()
	stands := r.sel.stillChoosable(p, &sel, c, s, w)
	p.mu.Unlock()
	if !stands {
		t.Fatal("a 16-token booking on the rank whose bookings in flight cover the prompt undid the pick")
	}
}
