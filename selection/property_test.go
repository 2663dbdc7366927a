package selection

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// naiveApprox is the reference model of ApproxIndex: per rank, a map from
// chain key to expiry, walked block by block.
type naiveApprox struct {
	ttl   time.Duration
	ranks map[Rank]map[uint64]int64
}

func (m *naiveApprox) record(r Rank, keys []uint64, now int64) {
	held := m.ranks[r]
	if held == nil {
		held = map[uint64]int64{}
		m.ranks[r] = held
	}
	for _, k := range keys {
		held[k] = now + int64(m.ttl)
	}
}

func (m *naiveApprox) depth(r Rank, keys []uint64, now int64) uint32 {
	d := uint32(0)
	for _, k := range keys {
		if e, ok := m.ranks[r][k]; !ok || e <= now {
			break
		}
		d++
	}
	return d
}

// TestApproxIndexMatchesNaiveModel runs random bookings, clock moves and
// lookups against ApproxIndex and the naive model; every lookup must agree.
// With 60 ranks, a lookup finds them by a map rather than by a scan.
func TestApproxIndexMatchesNaiveModel(t *testing.T) {
	for _, ranks := range []int{6, 60} {
		t.Run(fmt.Sprint(ranks, "_ranks"), func(t *testing.T) { approxMatchesNaiveModel(t, ranks) })
	}
}

func approxMatchesNaiveModel(t *testing.T, ranks int) {
	rng := rand.New(rand.NewPCG(5, 9))
	now := time.Unix(1000, 0)
	ai := NewApproxIndex(time.Minute)
	ai.now = func() time.Time { return now }
	ref := &naiveApprox{ttl: time.Minute, ranks: map[Rank]map[uint64]int64{}}
	k := PartitionKey{"m", "g"}
	// Prompts share prefixes: each is a random number of blocks drawn from
	// one of a few base sequences.
	bases := make([][]uint64, 4)
	for i := range bases {
		bases[i] = make([]uint64, 64)
		for j := range bases[i] {
			bases[i][j] = rng.Uint64()
		}
	}
	prompt := func() []uint64 { return bases[rng.IntN(len(bases))][:1+rng.IntN(64)] }
	for step := range 5000 {
		switch rng.IntN(10) {
		case 0:
			now = now.Add(time.Duration(rng.IntN(40)) * time.Second)
		case 1, 2, 3:
			blocks := prompt()
			r := Rank{uint64(rng.IntN(ranks)), 0}
			ai.RecordBooking(k, r, blocks)
			ref.record(r, AppendSequenceHashes(nil, blocks), now.UnixNano())
		default:
			blocks := prompt()
			var m Matches
			ai.FindMatches(k, blocks, &m)
			got := map[Rank]uint32{}
			for _, x := range m.List {
				got[x.Rank] = x.Tiers.Device
			}
			keys := AppendSequenceHashes(nil, blocks)
			for r := range ref.ranks {
				if want := ref.depth(r, keys, now.UnixNano()); got[r] != want {
					t.Fatalf("step %d rank %v: depth %d, model says %d", step, r, got[r], want)
				}
			}
		}
	}
}

// TestLoadTrieMatchesNaiveModel books and frees random prompts that share
// prefixes and checks the trie against a naive model: a rank's hit count is
// the longest prefix any of its bookings shares with the query, and its
// decode blocks are its distinct booked prefixes.
func TestLoadTrieMatchesNaiveModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	tr := newLoadTracker()
	ranks := make([]*rankState, 5)
	for i := range ranks {
		ranks[i] = &rankState{idx: i, rank: Rank{uint64(i), 0}}
	}
	bases := make([][]uint64, 3)
	for i := range bases {
		bases[i] = make([]uint64, 80)
		for j := range bases[i] {
			bases[i][j] = rng.Uint64()
		}
	}
	chain := func() []uint64 {
		return AppendSequenceHashes(nil, bases[rng.IntN(len(bases))][:1+rng.IntN(80)])
	}
	var live []*booking
	for step := range 4000 {
		if rng.IntN(3) == 0 && len(live) > 0 {
			i := rng.IntN(len(live))
			tr.free(live[i], true)
			live = append(live[:i], live[i+1:]...)
		} else {
			b := &booking{rs: ranks[rng.IntN(len(ranks))], hashes: chain()}
			tr.add(b, true)
			live = append(live, b)
		}
		q := chain()
		hits := make([]uint32, len(ranks))
		tr.countActive(q, hits)
		for i, rs := range ranks {
			want, distinct := 0, map[uint64]bool{}
			for _, b := range live {
				if b.rs == rs {
					want = max(want, commonPrefix(b.hashes, q))
					for _, h := range b.hashes {
						distinct[h] = true
					}
				}
			}
			if int(hits[i]) != want {
				t.Fatalf("step %d rank %d: trie hits %d, model %d", step, i, hits[i], want)
			}
			if rs.decodeBlocks() != uint64(len(distinct)) {
				t.Fatalf("step %d rank %d: decode blocks %d, model %d", step, i, rs.decodeBlocks(), len(distinct))
			}
		}
	}
	for _, b := range live {
		tr.free(b, true)
	}
	if len(tr.root.children) != 0 {
		t.Fatalf("%d edges left after every booking was freed", len(tr.root.children))
	}
	for i, rs := range ranks {
		if rs.decodeWeight != 0 || rs.requests != 0 {
			t.Fatalf("rank %d left with weight %v, requests %d", i, rs.decodeWeight, rs.requests)
		}
	}
}

// TestReservationCountsMatchModel runs random bookings (all three kinds,
// by several clients), frees, endpoint changes and TTL sweeps against a
// model of the live bookings: every refusal must be the one the model
// predicts (429 for a client at its bound, checked first, then 503 when
// every eligible rank is full), and after every step the per-client and
// per-rank counts must equal the model's.
func TestReservationCountsMatchModel(t *testing.T) {
	const perRank, perClient = 3, 4
	rng := rand.New(rand.NewPCG(11, 13))
	now := time.Unix(0, 0)
	cfg := DefaultConfig()
	cfg.UseKVEvents = false
	cfg.MaxReservationsPerRank, cfg.MaxReservationsPerClient = perRank, perClient
	cfg.ReservationTTL = time.Minute
	cfg.Rand = func() float64 { return 0.5 }
	r, err := NewRouter(cfg, WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ranks := []Rank{{1, 0}, {2, 0}, {3, 0}, {3, 1}}
	endpoints := map[uint64]string{1: "127.0.0.1:9", 2: "127.0.0.1:9", 3: "127.0.0.1:9"}
	addWorker(t, r, 1, nil)
	addWorker(t, r, 2, nil)
	addWorker(t, r, 3, func(w *WorkerRequest) { w.DataParallelSize = ptr(uint32(2)) })

	type live struct {
		client  string
		rank    Rank
		created time.Time
	}
	model := map[string]live{}
	clients := []string{"", "a", "b", "c"}
	count := func(match func(live) bool) int {
		n := 0
		for _, l := range model {
			if match(l) {
				n++
			}
		}
		return n
	}
	// predict is the status a booking by client on the eligible ranks gets.
	predict := func(client string, eligible []Rank) int {
		if client != "" && count(func(l live) bool { return l.client == client }) >= perClient {
			return 429
		}
		for _, rk := range eligible {
			if count(func(l live) bool { return l.rank == rk }) < perRank {
				return 0
			}
		}
		return 503
	}
	seen := map[int]int{}
	check := func(step int, what string, got error, want int) {
		t.Helper()
		status := 0
		if got != nil {
			status = StatusOf(got)
		}
		if status != want {
			t.Fatalf("step %d %s: status %d (%v), model says %d", step, what, status, got, want)
		}
		seen[status]++
	}
	for step := range 3000 {
		client := clients[rng.IntN(len(clients))]
		id := "s" + strconv.Itoa(step)
		switch op := rng.IntN(12); {
		case op < 4: // select_and_reserve, pinned to a rank or not
			pin := uint64(rng.IntN(4))
			eligible := ranks
			if pin != 0 {
				eligible = []Rank{{pin, 0}} // a pin names one rank
			}
			res, err := r.SelectAndReserve(&SelectRequest{Client: client, SelectionID: id, Prompt: Prompt{TokenIDs: make([]uint32, 32)},
				Placement: Placement{PinnedWorker: map[bool]*PinnedWorker{true: {WorkerID: pin}}[pin != 0]}})
			check(step, "select_and_reserve", err, predict(client, eligible))
			if err == nil {
				model[id] = live{client, Rank{res.WorkerID, res.DPRank}, now}
			}
		case op < 6: // an explicit booking on one rank
			rk := ranks[rng.IntN(len(ranks))]
			_, err := r.CreateReservation(&ReservationRequest{Client: client, SelectionID: ptr(id), WorkerID: ptr(rk.WorkerID), DPRank: ptr(rk.DPRank),
				Prompt: Prompt{SequenceHashes: Hashes{uint64(step)}, ISLTokens: ptr(uint64(16))}})
			check(step, "explicit reservation", err, predict(client, []Rank{rk}))
			if err == nil {
				model[id] = live{client, rk, now}
			}
		case op < 7: // a cached booking of a plain selection
			res, err := r.Select(&SelectRequest{SelectionID: id, Prompt: Prompt{TokenIDs: make([]uint32, 32)}})
			if err != nil {
				t.Fatal(err)
			}
			rk := Rank{res.WorkerID, res.DPRank}
			_, err = r.CreateReservation(&ReservationRequest{Client: client, SelectionID: ptr(id)})
			check(step, "cached reservation", err, predict(client, []Rank{rk}))
			if err == nil {
				model[id] = live{client, rk, now}
			}
		case op < 10: // free a live booking, or an unknown id
			ids := slices.Sorted(maps.Keys(model))
			if len(ids) == 0 || rng.IntN(8) == 0 {
				check(step, "free of an unknown id", r.Free(id), 404)
				continue
			}
			victim := ids[rng.IntN(len(ids))]
			check(step, "free", r.Free(victim), 0)
			delete(model, victim)
		case op < 11: // a new endpoint: the worker's bookings go
			w := uint64(1 + rng.IntN(3))
			endpoints[w] = "127.0.0.1:" + strconv.Itoa(100+step)
			if _, err := r.Catalog().PatchWorker(w, &WorkerRequest{Endpoint: ptr(endpoints[w])}); err != nil {
				t.Fatal(err)
			}
			maps.DeleteFunc(model, func(_ string, l live) bool { return l.rank.WorkerID == w })
		default: // time passes; the sweep frees what is older than the TTL
			now = now.Add(time.Duration(rng.IntN(40)) * time.Second)
			r.Sweep()
			maps.DeleteFunc(model, func(_ string, l live) bool { return l.created.Before(now.Add(-cfg.ReservationTTL)) })
		}

		r.book.mu.Lock()
		counted := maps.Clone(r.book.clients)
		r.book.mu.Unlock()
		for _, c := range clients[1:] {
			if want := count(func(l live) bool { return l.client == c }); counted[c].bookings != want {
				t.Fatalf("step %d: client %s counted %d, model %d", step, c, counted[c].bookings, want)
			}
		}
		if _, ok := counted[""]; ok || len(counted) > 3 {
			t.Fatalf("step %d: unexpected counts %v", step, counted)
		}
		for _, rk := range ranks {
			if got, want := loadOf(r, rk.WorkerID, rk.DPRank).ActiveRequests, count(func(l live) bool { return l.rank == rk }); got != uint64(want) {
				t.Fatalf("step %d: rank %v has %d requests, model %d", step, rk, got, want)
			}
		}
		if r.ActiveReservations() != len(model) {
			t.Fatalf("step %d: %d reservations, model %d", step, r.ActiveReservations(), len(model))
		}
	}
	if seen[429] == 0 || seen[503] == 0 || seen[0] == 0 {
		t.Fatalf("the run never reached a bound: %v", seen)
	}
	t.Logf("statuses: %v", seen)
}

// TestReservationCountsConcurrent books, frees, re-registers and sweeps
// from several goroutines (run it with -race); no count ever passes its
// bound, and when everything is freed every count is back to zero.
func TestReservationCountsConcurrent(t *testing.T) {
	const perRank, perClient = 8, 5
	r := newTestRouter(t, func(c *Config) { c.MaxReservationsPerRank, c.MaxReservationsPerClient = perRank, perClient })
	for id := uint64(1); id <= 3; id++ {
		addWorker(t, r, id, nil)
	}
	overBound := func() string {
		r.book.mu.Lock()
		defer r.book.mu.Unlock()
		for c, n := range r.book.clients {
			if n.bookings > perClient {
				return c
			}
		}
		return ""
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := []string{"", "a", "a", "b"}[g]
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			var mine []string
			for range 400 {
				if len(mine) > 0 && rng.IntN(2) == 0 {
					i := rng.IntN(len(mine))
					_ = r.Free(mine[i]) // may be gone with an endpoint change
					mine = slices.Delete(mine, i, i+1)
					continue
				}
				res, err := r.SelectAndReserve(&SelectRequest{Client: client, Prompt: Prompt{TokenIDs: make([]uint32, 16)}})
				if err == nil {
					mine = append(mine, res.SelectionID)
				} else if s := StatusOf(err); s != 429 && s != 503 {
					t.Error(err)
					return
				}
				if c := overBound(); c != "" {
					t.Errorf("client %s past its bound", c)
					return
				}
			}
			for _, id := range mine {
				_ = r.Free(id)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 100 {
			if _, err := r.Catalog().PatchWorker(uint64(1+i%3), &WorkerRequest{Endpoint: ptr("127.0.0.1:" + strconv.Itoa(100+i))}); err != nil {
				t.Error(err)
				return
			}
			r.Sweep()
			for _, m := range r.Queries().Loads("", "") {
				for _, l := range m.Loads {
					if l.ActiveRequests > perRank {
						t.Errorf("rank %d/%d holds %d bookings", l.WorkerID, l.DPRank, l.ActiveRequests)
						return
					}
				}
			}
		}
	}()
	wg.Wait()
	r.book.mu.Lock()
	left := len(r.book.clients)
	r.book.mu.Unlock()
	if left != 0 || r.ActiveReservations() != 0 {
		t.Fatalf("after every free: %d clients counted, %d reservations", left, r.ActiveReservations())
	}
	for _, m := range r.Queries().Loads("", "") {
		for _, l := range m.Loads {
			if l.ActiveRequests != 0 || l.PotentialPrefillTokens != 0 {
				t.Fatalf("load left behind: %+v", l)
			}
		}
	}
}
