package selection

import (
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

func ptr[T any](v T) *T { return &v }

func newTestRouter(t testing.TB, mutate func(*Config)) *Router {
	t.Helper()
	cfg := DefaultConfig()
	cfg.UseKVEvents = false
	rng := rand.New(rand.NewPCG(7, 7))
	var mu sync.Mutex
	cfg.Rand = func() float64 { mu.Lock(); defer mu.Unlock(); return rng.Float64() }
	if mutate != nil {
		mutate(&cfg)
	}
	r, err := NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

func addWorker(t testing.TB, r *Router, id uint64, mutate func(*WorkerRequest)) WorkerRecord {
	t.Helper()
	req := &WorkerRequest{WorkerID: ptr(id), Endpoint: ptr("127.0.0.1:9"), BlockSize: ptr(uint32(16))}
	if mutate != nil {
		mutate(req)
	}
	rec, err := r.Catalog().UpsertWorker(req)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func mustStatus(t *testing.T, err error, status int, substr string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want status %d (%s), got success", status, substr)
	}
	if StatusOf(err) != status || !strings.Contains(err.Error(), substr) {
		t.Fatalf("want %d containing %q, got %d %q", status, substr, StatusOf(err), err)
	}
}

func loadOf(r *Router, w uint64, dp uint32) PotentialLoad {
	for _, m := range r.Queries().Loads("", "") {
		for _, l := range m.Loads {
			if l.WorkerID == w && l.DPRank == dp {
				return l
			}
		}
	}
	return PotentialLoad{}
}

func book(t *testing.T, r *Router, id string, w uint64, dp uint32, seq []uint64, isl, prefill uint64) {
	t.Helper()
	_, err := r.CreateReservation(&ReservationRequest{SelectionID: ptr(id), WorkerID: ptr(w), DPRank: ptr(dp),
		Prompt:                 Prompt{SequenceHashes: seq, ISLTokens: ptr(isl)},
		EffectivePrefillTokens: ptr(prefill)})
	if err != nil {
		t.Fatal(err)
	}
}

// TestSlotTrackerVectors mirrors Dynamo's standalone slot tracker test
// (docs/selection-api.md, "Loads and scores"): decode blocks are deduplicated by sequence hash per rank.
func TestSlotTrackerVectors(t *testing.T) {
	r := newTestRouter(t, nil)
	addWorker(t, r, 7, func(w *WorkerRequest) { w.DataParallelSize = ptr(uint32(2)) })
	addWorker(t, r, 8, nil)
	var m22 int64 = -22
	neg22 := uint64(m22)
	book(t, r, "req-a", 7, 0, []uint64{11, neg22, 33}, 48, 48)
	book(t, r, "req-b", 7, 0, []uint64{11, neg22, 44}, 16, 16)
	book(t, r, "req-c", 7, 1, []uint64{11, neg22, 55}, 48, 0)
	for _, c := range []struct {
		w    uint64
		dp   uint32
		want uint64
	}{{7, 0, 4}, {7, 1, 3}, {8, 0, 0}} {
		if got := loadOf(r, c.w, c.dp).PotentialDecodeBlocks; got != c.want {
			t.Fatalf("active decode (%d,%d) = %d, want %d", c.w, c.dp, got, c.want)
		}
	}
	pl, err := r.Queries().PotentialLoads(&ScoreRequest{Prompt: Prompt{BlockHashes: Hashes{1, 2, 3, 4},
		SequenceHashes: Hashes{11, neg22, 33, 66}, ISLTokens: ptr(uint64(64))}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[Rank]uint64{{7, 0}: 5, {7, 1}: 5, {8, 0}: 4}
	for _, l := range pl {
		if l.PotentialDecodeBlocks != want[Rank{l.WorkerID, l.DPRank}] {
			t.Fatalf("potential decode %+v, want %v", l, want)
		}
	}
	if got := loadOf(r, 7, 0).PotentialPrefillTokens; got != 64 {
		t.Fatalf("prefill after 48+16 = %d", got)
	}
	for range 2 {
		if err := r.PrefillComplete("req-a"); err != nil {
			t.Fatal(err)
		}
	}
	if got := loadOf(r, 7, 0).PotentialPrefillTokens; got != 16 {
		t.Fatalf("prefill after completing req-a twice = %d, want 16", got)
	}
	if err := r.Free("req-b"); err != nil {
		t.Fatal(err)
	}
	l := loadOf(r, 7, 0)
	if l.PotentialDecodeBlocks != 3 || l.PotentialPrefillTokens != 0 || l.ActiveRequests != 1 {
		t.Fatalf("after freeing req-b: %+v", l)
	}
	mustStatus(t, r.Free("req-b"), 404, "reservation req-b not found")
}

func TestSelectDoesNotBookAndEchoesID(t *testing.T) {
	r := newTestRouter(t, nil)
	addWorker(t, r, 1, func(w *WorkerRequest) { w.BlockSize = ptr(uint32(4)) })
	res, err := r.Select(&SelectRequest{SelectionID: "sel-1", Prompt: Prompt{TokenIDs: []uint32{1, 2, 3, 4}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.SelectionID != "sel-1" || res.EffectivePrefillTokens != 4 || res.Overlap.LongestMatched != 0 ||
		len(res.Overlap.DP) != 1 || res.Overlap.DP["0"] != 0 || res.SequenceHashes != nil || res.ISLTokens != nil {
		t.Fatalf("select response %+v", res)
	}
	if loadOf(r, 1, 0).ActiveRequests != 0 {
		t.Fatal("select must not book load")
	}
}

func TestSelectAndReserveConflictsAndFreesOnce(t *testing.T) {
	r := newTestRouter(t, nil)
	addWorker(t, r, 1, func(w *WorkerRequest) { w.BlockSize = ptr(uint32(4)) })
	req := &SelectRequest{SelectionID: "x", Prompt: Prompt{TokenIDs: []uint32{1, 2, 3, 4}}}
	res, err := r.SelectAndReserve(req)
	if err != nil {
		t.Fatal(err)
	}
	if *res.ISLTokens != 4 || !*res.TrackPrefillTokens || len(res.SequenceHashes) != 1 {
		t.Fatalf("booked response %+v", res)
	}
	if l := loadOf(r, 1, 0); l.PotentialPrefillTokens != 4 || l.ActiveRequests != 1 {
		t.Fatalf("load %+v", l)
	}
	_, err = r.SelectAndReserve(req)
	mustStatus(t, err, 409, "selection x is already reserved or being reserved")
	// Ids are global: the same id in another partition also conflicts.
	addWorker(t, r, 2, func(w *WorkerRequest) { w.ModelName = ptr("other"); w.BlockSize = ptr(uint32(4)) })
	_, err = r.SelectAndReserve(&SelectRequest{SelectionID: "x", Partition: Partition{ModelName: "other"}, Prompt: Prompt{TokenIDs: []uint32{1}}})
	mustStatus(t, err, 409, "already reserved")
	gen, err := r.SelectAndReserve(&SelectRequest{Prompt: Prompt{TokenIDs: []uint32{1}}})
	if err != nil || len(gen.SelectionID) != 36 || gen.SelectionID[14] != '4' {
		t.Fatalf("generated id %q, %v", gen.SelectionID, err)
	}
	if err := r.Free("x"); err != nil {
		t.Fatal(err)
	}
	if err := r.Free(gen.SelectionID); err != nil {
		t.Fatal(err)
	}
	if l := loadOf(r, 1, 0); l.ActiveRequests != 0 || l.PotentialPrefillTokens != 0 || l.PotentialDecodeBlocks != 0 {
		t.Fatalf("after free: %+v", l)
	}
}

func TestApproximateIndexRoutesSharedPrefixes(t *testing.T) {
	r := newTestRouter(t, nil)
	for id := uint64(1); id <= 4; id++ {
		addWorker(t, r, id, func(w *WorkerRequest) { w.BlockSize = ptr(uint32(4)) })
	}
	prompt := func(n int, salt uint32) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = uint32(i) + salt
		}
		return out
	}
	first, err := r.SelectAndReserve(&SelectRequest{Prompt: Prompt{TokenIDs: prompt(64, 0)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Free(first.SelectionID); err != nil {
		t.Fatal(err)
	}
	// The same prefix, extended, goes to the same worker and reports the hit.
	res, err := r.Select(&SelectRequest{Prompt: Prompt{TokenIDs: prompt(80, 0)}})
	if err != nil {
		t.Fatal(err)
	}
	if res.WorkerID != first.WorkerID || res.Overlap.GPU != 64 || res.Overlap.LongestMatched != 64 || res.EffectivePrefillTokens != 16 {
		t.Fatalf("prefix hit: first %d, now %+v", first.WorkerID, res)
	}
	// A different prefix is not matched.
	res, _ = r.Select(&SelectRequest{Prompt: Prompt{TokenIDs: prompt(64, 1000)}})
	if res.Overlap.LongestMatched != 0 {
		t.Fatalf("unrelated prompt matched %d", res.Overlap.LongestMatched)
	}
	// A cache salt makes the same tokens a different prefix.
	res, _ = r.Select(&SelectRequest{Prompt: Prompt{TokenIDs: prompt(64, 0), CacheSalt: "tenant-b"}})
	if res.Overlap.LongestMatched != 0 {
		t.Fatal("salted prompt matched an unsalted prefix")
	}
	dump := r.Queries().Dump()["default:default"]
	if dump.BlockSize != 4 || len(dump.Events) != 16 || dump.Events[0].Event.Data.Stored.ParentHash != nil {
		t.Fatalf("dump: %d events", len(dump.Events))
	}
}

func TestApproxIndexExpires(t *testing.T) {
	now := time.Unix(1000, 0)
	ai := NewApproxIndex(time.Minute)
	ai.now = func() time.Time { return now }
	k := PartitionKey{"m", "g"}
	ai.RecordBooking(k, Rank{1, 0}, []uint64{10, 20, 30})
	ai.RecordBooking(k, Rank{2, 0}, []uint64{10, 20})
	var m Matches
	ai.FindMatches(k, []uint64{10, 20, 30, 40}, &m)
	got := map[Rank]uint32{}
	for _, x := range m.List {
		got[x.Rank] = x.Tiers.Device
	}
	if got[Rank{1, 0}] != 3 || got[Rank{2, 0}] != 2 || len(got) != 2 {
		t.Fatalf("matches %v", got)
	}
	now = now.Add(2 * time.Minute)
	m.Reset()
	ai.FindMatches(k, []uint64{10}, &m)
	if len(m.List) != 0 {
		t.Fatalf("expired entries matched: %v", m.List)
	}
}

func TestPendingSelectionLifecycle(t *testing.T) {
	r := newTestRouter(t, nil)
	addWorker(t, r, 1, func(w *WorkerRequest) { w.BlockSize = ptr(uint32(4)) })
	_, err := r.CreateReservation(&ReservationRequest{SelectionID: ptr("nope")})
	mustStatus(t, err, 404, "no pending selection nope for default:default (expired, already used, or never selected)")
	_, err = r.CreateReservation(&ReservationRequest{})
	mustStatus(t, err, 422, "selection_id")
	if _, err := r.Select(&SelectRequest{SelectionID: "s1", Prompt: Prompt{TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8}},
		RouterConfigOverride: &RouterConfigOverride{TrackPrefillTokens: ptr(false)}}); err != nil {
		t.Fatal(err)
	}
	// Wrong partition: not found.
	_, err = r.CreateReservation(&ReservationRequest{SelectionID: ptr("s1"), Partition: Partition{ModelName: "other"}})
	mustStatus(t, err, 404, "no pending selection")
	// Request overrides are ignored on a cached booking: selection time wins.
	res, err := r.CreateReservation(&ReservationRequest{SelectionID: ptr("s1"),
		RouterConfigOverride: &RouterConfigOverride{TrackPrefillTokens: ptr(true)}})
	if err != nil || res.WorkerID != 1 || res.Endpoint != "127.0.0.1:9" {
		t.Fatalf("cached booking: %+v %v", res, err)
	}
	if l := loadOf(r, 1, 0); l.ActiveRequests != 1 || l.PotentialPrefillTokens != 0 || l.PotentialDecodeBlocks != 2 {
		t.Fatalf("cached booking load %+v", l)
	}
	_, err = r.CreateReservation(&ReservationRequest{SelectionID: ptr("s1")})
	mustStatus(t, err, 404, "no pending selection") // single use
	_ = r.Free("s1")

	// A stale rank: 404, then a retry after the worker returns succeeds.
	if _, err := r.Select(&SelectRequest{SelectionID: "s2", Prompt: Prompt{TokenIDs: []uint32{1}}}); err != nil {
		t.Fatal(err)
	}
	addWorker(t, r, 1, func(w *WorkerRequest) { w.BlockSize = ptr(uint32(4)); w.DataParallelStartRank = ptr(uint32(5)) })
	_, err = r.CreateReservation(&ReservationRequest{SelectionID: ptr("s2")})
	mustStatus(t, err, 404, "no longer schedulable")
	addWorker(t, r, 1, func(w *WorkerRequest) { w.BlockSize = ptr(uint32(4)) })
	if _, err := r.CreateReservation(&ReservationRequest{SelectionID: ptr("s2")}); err != nil {
		t.Fatal(err)
	}
	// An explicit booking discards a cached selection with the same id.
	if _, err := r.Select(&SelectRequest{SelectionID: "s3", Prompt: Prompt{TokenIDs: []uint32{1}}}); err != nil {
		t.Fatal(err)
	}
	book(t, r, "s3", 1, 0, []uint64{1}, 4, 4)
	_ = r.Free("s3")
	_, err = r.CreateReservation(&ReservationRequest{SelectionID: ptr("s3")})
	mustStatus(t, err, 404, "no pending selection")
}

func TestExplicitReservationValidation(t *testing.T) {
	r := newTestRouter(t, nil)
	addWorker(t, r, 1, nil)
	bad := func(req ReservationRequest, status int, msg string) {
		t.Helper()
		req.SelectionID = ptr("e")
		if req.WorkerID == nil {
			req.WorkerID = ptr(uint64(1))
		}
		_, err := r.CreateReservation(&req)
		mustStatus(t, err, status, msg)
	}
	bad(ReservationRequest{}, 400, "sequence_hashes is required without token_ids")
	bad(ReservationRequest{Prompt: Prompt{SequenceHashes: Hashes{1}}}, 400, "isl_tokens is required without token_ids")
	bad(ReservationRequest{Prompt: Prompt{SequenceHashes: Hashes{1}, ISLTokens: ptr(uint64(0))}}, 400, "isl_tokens must be greater than 0")
	bad(ReservationRequest{Prompt: Prompt{SequenceHashes: Hashes{1}, ISLTokens: ptr(uint64(16))}, EffectivePrefillTokens: ptr(uint64(17))},
		400, "effective_prefill_tokens (17) must not exceed isl_tokens (16)")
	bad(ReservationRequest{WorkerID: ptr(uint64(9)), Prompt: Prompt{SequenceHashes: Hashes{1}, ISLTokens: ptr(uint64(16))}}, 404, "worker 9 dp_rank 0 is not schedulable")
	_, err := r.Select(&SelectRequest{Prompt: Prompt{BlockHashes: Hashes{1, 2}, SequenceHashes: Hashes{1}, ISLTokens: ptr(uint64(32))}})
	mustStatus(t, err, 400, "block_hashes length 2 must match sequence_hashes length 1")
	_, err = r.Select(&SelectRequest{Prompt: Prompt{SequenceHashes: Hashes{1}, ISLTokens: ptr(uint64(32))}})
	mustStatus(t, err, 400, "block_hashes is required without token_ids")
	_, err = r.Select(&SelectRequest{Prompt: Prompt{TokenIDs: []uint32{1}}, RouterConfigOverride: &RouterConfigOverride{PrefillLoadScale: ptr(-1.0)}})
	mustStatus(t, err, 400, "prefill_load_scale must be finite and non-negative")
}

// TestSelectionIDBound: a selection id longer than 256 bytes is refused
// by every route that takes one, and nothing is booked or remembered for
// it; one of 256 bytes is taken.
func TestSelectionIDBound(t *testing.T) {
	r := newTestRouter(t, nil)
	addWorker(t, r, 1, nil)
	prompt := Prompt{TokenIDs: make([]uint32, 32)}
	long := strings.Repeat("i", 257)
	_, err := r.SelectAndReserve(&SelectRequest{SelectionID: long, Prompt: prompt})
	mustStatus(t, err, 400, "selection_id must be at most 256 bytes")
	_, err = r.Select(&SelectRequest{SelectionID: long, Prompt: prompt})
	mustStatus(t, err, 400, "selection_id must be at most 256 bytes")
	_, err = r.CreateReservation(&ReservationRequest{SelectionID: &long, WorkerID: ptr(uint64(1)), Prompt: prompt})
	mustStatus(t, err, 400, "selection_id must be at most 256 bytes")
	if n := r.ActiveReservations(); n != 0 {
		t.Fatalf("%d reservations held after the refusals", n)
	}
	res, err := r.SelectAndReserve(&SelectRequest{SelectionID: long[:256], Prompt: prompt})
	if err != nil || res.SelectionID != long[:256] {
		t.Fatalf("a 256-byte id: %+v %v", res, err)
	}
}

func TestPlacement(t *testing.T) {
	r := newTestRouter(t, nil)
	addWorker(t, r, 1, func(w *WorkerRequest) { w.Taints = []string{"gpu=h100"} })
	addWorker(t, r, 2, func(w *WorkerRequest) { w.DataParallelSize = ptr(uint32(2)) })
	sel := func(pl Placement) (*SelectResponse, error) {
		return r.Select(&SelectRequest{Placement: pl, Prompt: Prompt{TokenIDs: make([]uint32, 32)}})
	}
	for range 20 {
		res, err := sel(Placement{PinnedWorker: &PinnedWorker{WorkerID: 2, DPRank: 1}})
		if err != nil || res.WorkerID != 2 || res.DPRank != 1 {
			t.Fatalf("pinned: %+v %v", res, err)
		}
		res, err = sel(Placement{AllowedWorkerIDs: []uint64{2}})
		if err != nil || res.WorkerID != 2 {
			t.Fatalf("allowed: %+v %v", res, err)
		}
		res, err = sel(Placement{RoutingConstraints: &RoutingConstraints{RequiredTaints: []string{"gpu=h100"}}})
		if err != nil || res.WorkerID != 1 {
			t.Fatalf("required taint: %+v %v", res, err)
		}
		res, err = sel(Placement{AffinityTarget: &AffinityTarget{WorkerID: 2, DPRank: ptr(uint32(0))}})
		if err != nil || res.WorkerID != 2 || res.DPRank != 0 {
			t.Fatalf("affinity target: %+v %v", res, err)
		}
		res, err = sel(Placement{RoutingConstraints: &RoutingConstraints{PreferredTaints: map[string]float32{"gpu=h100": 5}}})
		if err != nil || res.WorkerID != 1 {
			t.Fatalf("preferred taint: %+v %v", res, err)
		}
	}
	_, err := sel(Placement{PinnedWorker: &PinnedWorker{WorkerID: 2, DPRank: 7}})
	mustStatus(t, err, 503, "not eligible")
	_, err = sel(Placement{AllowedWorkerIDs: []uint64{99}})
	mustStatus(t, err, 503, "filtered")
	_, err = sel(Placement{SessionID: strings.Repeat("s", 257)})
	mustStatus(t, err, 400, "at most 256 bytes")
}

func TestSessionAffinity(t *testing.T) {
	now := time.Unix(0, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	mk := func(soft bool) *Router {
		cfg := DefaultConfig()
		cfg.UseKVEvents = false
		cfg.SessionAffinityTTL = time.Minute
		cfg.SessionAffinitySoft = soft
		cfg.SessionTableCap = 2
		r, err := NewRouter(cfg, WithClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		for id := uint64(1); id <= 3; id++ {
			addWorker(t, r, id, nil)
		}
		return r
	}
	r := mk(false)
	res, err := r.SelectAndReserve(&SelectRequest{SelectionID: "a1", Placement: Placement{SessionID: "s"}, Prompt: Prompt{TokenIDs: []uint32{1}}})
	if err != nil {
		t.Fatal(err)
	}
	bound := res.WorkerID
	// session_context wins over session_id and is the same session here.
	for i := range 10 {
		res, err := r.Select(&SelectRequest{Placement: Placement{SessionID: "other", SessionContext: &SessionContext{SessionID: "s"}},
			Prompt: Prompt{TokenIDs: make([]uint32, 64*(i+1))}})
		if err != nil || res.WorkerID != bound {
			t.Fatalf("bound session routed to %d, want %d (%v)", res.WorkerID, bound, err)
		}
	}
	// Hard mode: an explicit dispatch elsewhere is refused and unbinds.
	other := bound%3 + 1
	_, err = r.CreateReservation(&ReservationRequest{SelectionID: ptr("a2"), WorkerID: ptr(other), Placement: Placement{SessionID: "s"},
		Prompt: Prompt{SequenceHashes: Hashes{1}, ISLTokens: ptr(uint64(1))}})
	mustStatus(t, err, 400, "is bound to worker")
	if r.affinity.len() != 0 {
		t.Fatal("hard-mode violation must drop the binding")
	}
	// Full table: new sessions route unpinned.
	_ = r.Free("a1")
	for i, s := range []string{"x", "y", "z"} {
		if _, err := r.SelectAndReserve(&SelectRequest{Placement: Placement{SessionID: s}, Prompt: Prompt{TokenIDs: []uint32{1}}}); err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
	}
	if r.affinity.len() != 2 {
		t.Fatalf("table len %d, want cap 2", r.affinity.len())
	}
	// Idle bindings expire TTL after their last lease.
	for _, id := range r.book.liveIDs() {
		_ = r.Free(id)
	}
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	r.Sweep()
	if r.affinity.len() != 0 {
		t.Fatalf("%d bindings survived their TTL", r.affinity.len())
	}

	// Soft mode: the binding follows the dispatch.
	r = mk(true)
	res, _ = r.SelectAndReserve(&SelectRequest{Placement: Placement{SessionID: "s"}, Prompt: Prompt{TokenIDs: []uint32{1}}})
	other = res.WorkerID%3 + 1
	if _, err := r.CreateReservation(&ReservationRequest{SelectionID: ptr("b2"), WorkerID: ptr(other), Placement: Placement{SessionID: "s"},
		Prompt: Prompt{SequenceHashes: Hashes{1}, ISLTokens: ptr(uint64(1))}}); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Select(&SelectRequest{Placement: Placement{SessionID: "s"}, Prompt: Prompt{TokenIDs: []uint32{1}}}); got.WorkerID != other {
		t.Fatalf("soft binding did not follow: %d, want %d", got.WorkerID, other)
	}
	// A departed bound worker re-initialises the session.
	if _, err := r.Catalog().DeleteWorker(other); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Select(&SelectRequest{Placement: Placement{SessionID: "s"}, Prompt: Prompt{TokenIDs: []uint32{1}}}); err != nil || got.WorkerID == other {
		t.Fatalf("departed worker still chosen: %+v %v", got, err)
	}
}

// fixedIndex answers FindMatches with fixed tiers; it stands in for the
// event-fed index (a later issue) to check how tiers are reported.
type fixedIndex map[Rank]Tiers

func (f fixedIndex) FindMatches(_ PartitionKey, _ []uint64, out *Matches) {
	for r, t := range f {
		out.List = append(out.List, Match{Rank: r, Tiers: t})
	}
}
func (f fixedIndex) RemoveWorker(PartitionKey, uint64) {}
func (f fixedIndex) Dump(PartitionKey) []RouterEvent   { return nil }

func TestPendingCacheBounds(t *testing.T) {
	now := time.Unix(0, 0)
	c := newPendingCache(time.Minute, 2, 1<<20, func() time.Time { return now })
	k := func(id string) pendingKey { return pendingKey{PartitionKey{"m", "g"}, id} }
	c.insert(&pendingEntry{key: k("a")})
	c.insert(&pendingEntry{key: k("b")})
	c.insert(&pendingEntry{key: k("c")})
	if c.peek(k("a")) != nil || c.peek(k("b")) == nil || c.len() != 2 {
		t.Fatal("cap must evict the oldest first")
	}
	e := c.peek(k("b"))
	c.insert(&pendingEntry{key: k("b")}) // a newer selection under the same key
	c.remove(k("b"), e.generation)
	if c.peek(k("b")) == nil {
		t.Fatal("remove must yield to a newer selection")
	}
	now = now.Add(2 * time.Minute)
	if c.peek(k("c")) != nil {
		t.Fatal("peek must refuse an expired entry")
	}
	c.insert(&pendingEntry{key: k("d")})
	if c.len() != 1 {
		t.Fatalf("insert must sweep expired entries, len %d", c.len())
	}
	small := newPendingCache(time.Minute, 100, 100, time.Now)
	small.insert(&pendingEntry{key: k("x"), hashes: make([]uint64, 10)})
	small.insert(&pendingEntry{key: k("y"), hashes: make([]uint64, 10)})
	if small.peek(k("x")) != nil || small.peek(k("y")) == nil {
		t.Fatal("byte budget must evict the oldest")
	}
}
