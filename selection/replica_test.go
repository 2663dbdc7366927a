package selection

import (
	"fmt"
	"reflect"
	"sync"
	"testing"
)

// directSink hands router A's booking lifecycle to router B's remote
// table, as the cluster package does over NATS.
type directSink struct {
	mu     sync.Mutex
	origin string
	to     *Router
	maxPer int
	seen   []RemoteOutcome
}

func (d *directSink) Reserved(rec *BookingRecord) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seen = append(d.seen, d.to.Remote().Reserve(d.origin, rec, d.maxPer))
}
func (d *directSink) PrefillCompleted(id string) { d.to.Remote().PrefillCompleted(d.origin, id) }
func (d *directSink) OutputBlock(id string, f *float64) {
	d.to.Remote().OutputBlock(d.origin, id, f)
}
func (d *directSink) Freed(id string) { d.to.Remote().Free(d.origin, id) }

func TestReplicaBookingLifecycleMirrorsLoad(t *testing.T) {
	a := newTestRouter(t, nil)
	b := newTestRouter(t, nil)
	for _, r := range []*Router{a, b} {
		addWorker(t, r, 1, nil)
		addWorker(t, r, 2, nil)
	}
	a.SetReplicaSink(&directSink{origin: "a", to: b})

	book(t, a, "s1", 1, 0, []uint64{1, 2, 3}, 48, 40)
	book(t, a, "s2", 1, 0, []uint64{1, 2, 4}, 48, 20)
	want := loadOf(a, 1, 0)
	if got := loadOf(b, 1, 0); got != want {
		t.Fatalf("B sees %+v of A's bookings, A has %+v", got, want)
	}
	if want.ActiveRequests != 2 || want.PotentialPrefillTokens != 60 || want.PotentialDecodeBlocks != 4 {
		t.Fatalf("A's own load is %+v", want)
	}
	// B's own booking on the same rank adds to A's: B's load is the fleet's.
	book(t, b, "s3", 1, 0, []uint64{1, 2, 3}, 48, 10)
	if got := loadOf(b, 1, 0); got.ActiveRequests != 3 || got.PotentialPrefillTokens != 70 || got.PotentialDecodeBlocks != 4 {
		t.Fatalf("B's fleet load %+v", got)
	}
	if err := a.PrefillComplete("s1"); err != nil {
		t.Fatal(err)
	}
	if got := loadOf(b, 1, 0); got.PotentialPrefillTokens != 30 {
		t.Fatalf("after prefill complete B sees %+v", got)
	}
	if err := a.AddOutputBlock("s2", nil); err != nil {
		t.Fatal(err)
	}
	if got, want := loadOf(b, 1, 0).PotentialDecodeBlocks, loadOf(a, 1, 0).PotentialDecodeBlocks; got != want {
		t.Fatalf("after an output block B sees %d decode blocks, A %d", got, want)
	}
	for _, id := range []string{"s1", "s2"} {
		if err := a.Free(id); err != nil {
			t.Fatal(err)
		}
	}
	if got := loadOf(b, 1, 0); got.ActiveRequests != 1 || got.PotentialPrefillTokens != 10 || got.PotentialDecodeBlocks != 3 {
		t.Fatalf("after A freed, B sees %+v; want only its own booking", got)
	}
	if n := b.Remote().Total(); n != 0 {
		t.Fatalf("B still holds %d remote bookings", n)
	}
}

func TestReplicaRemoteBoundsAndDrop(t *testing.T) {
	b := newTestRouter(t, nil)
	addWorker(t, b, 1, nil)
	rm := b.Remote()
	rec := func(id string, w uint64) *BookingRecord {
		return &BookingRecord{ID: id, Partition: PartitionKey{}, Rank: Rank{WorkerID: w}, Hashes: []uint64{9}, PrefillTokens: 5}
	}
	if got := rm.Reserve("a", rec("x", 1), 2); got != RemoteApplied {
		t.Fatalf("first reserve: %v", got)
	}
	if got := rm.Reserve("a", rec("x", 1), 2); got != RemoteDuplicate {
		t.Fatalf("re-announced reserve: %v", got)
	}
	if got := rm.Reserve("a", rec("y", 77), 2); got != RemoteUnknownRank {
		t.Fatalf("reserve on a worker B does not have: %v", got)
	}
	rm.Reserve("a", rec("y", 1), 2)
	if got := rm.Reserve("a", rec("z", 1), 2); got != RemoteOverBound {
		t.Fatalf("third reserve over a bound of 2: %v", got)
	}
	if got := loadOf(b, 1, 0); got.ActiveRequests != 2 || got.PotentialPrefillTokens != 10 {
		t.Fatalf("load %+v", got)
	}
	if n := rm.DropOrigin("a"); n != 2 {
		t.Fatalf("dropped %d", n)
	}
	if got := loadOf(b, 1, 0); got != (PotentialLoad{WorkerID: 1}) {
		t.Fatalf("after the drop: %+v", got)
	}
}

// TestReplicaRemoteTotalsAreBounded: many origins, each within its own
// bounds, hold at most maxOriginsInFull origins' worth in all (256 origins
// at their bounds were 256 times one's: some 9.7 GB at the defaults), in
// bookings and in blocks; an origin already holding its fair share of the
// full table is refused, and what is freed makes room again.
func TestReplicaRemoteTotalsAreBounded(t *testing.T) {
	b := newTestRouter(t, nil)
	addWorker(t, b, 1, nil)
	rm := b.Remote()
	rec := func(id string, blocks int) *BookingRecord {
		return &BookingRecord{ID: id, Rank: Rank{WorkerID: 1}, Hashes: make([]uint64, blocks), PrefillTokens: 5}
	}
	const perOrigin = 2
	for o := range maxOriginsInFull {
		for i := range perOrigin {
			if got := rm.Reserve(fmt.Sprint("o", o), rec(fmt.Sprint(i), 1), perOrigin); got != RemoteApplied {
				t.Fatalf("origin %d, booking %d: %v", o, i, got)
			}
		}
	}
	// The table is full; a ninth origin's fair share is 16/9, one booking.
	if got := rm.Reserve("late", rec("0", 1), perOrigin); got != RemoteApplied {
		t.Fatalf("a ninth origin's first booking: %v, want applied", got)
	}
	if got := rm.Reserve("late", rec("1", 1), perOrigin); got != RemoteOverBound {
		t.Fatalf("past its fair share: %v, want over bound", got)
	}
	if n := rm.Total(); n != maxOriginsInFull*perOrigin || rm.Evicted() != 1 {
		t.Fatalf("%d bookings held, %d evicted; want %d, 1", n, rm.Evicted(), maxOriginsInFull*perOrigin)
	}
	// The eviction took one booking of whichever origin the map yielded
	// first, so o0's "0" may be gone already: free one o0 still holds.
	if !rm.Free("o0", "0") && !rm.Free("o0", "1") {
		t.Fatal("o0 held neither booking")
	}
	if got := rm.Reserve("late", rec("1", 1), perOrigin); got != RemoteApplied {
		t.Fatalf("after a free: %v, want applied", got)
	}
	rm.DropAll()
	rm.SetMaxBlocksPerOrigin(10)
	for o := range maxOriginsInFull {
		if got := rm.Reserve(fmt.Sprint("o", o), rec("big", 10), 0); got != RemoteApplied {
			t.Fatalf("origin %d's 10 blocks: %v", o, got)
		}
	}
	if got := rm.Reserve("o0", rec("more", 1), 0); got != RemoteOverBound {
		t.Fatalf("a block past an origin's bound: %v, want over bound", got)
	}
	// 80 blocks over 9 origins: a share of 8, which 9 blocks pass.
	if got := rm.Reserve("one more", rec("big", 9), 0); got != RemoteOverBound {
		t.Fatalf("9 blocks past a fair share of 8: %v, want over bound", got)
	}
	if got := rm.Reserve("one more", rec("big", 8), 0); got != RemoteApplied {
		t.Fatalf("8 blocks within a fair share of 8: %v, want applied", got)
	}
	counts := rm.Counts()
	if n := rm.DropAll(); n != maxOriginsInFull || rm.Total() != 0 || counts["one more"] != 1 || len(counts) != maxOriginsInFull {
		t.Fatalf("dropped %d, %d left, counts %v", n, rm.Total(), counts)
	}
}

// TestReplicaRemoteFairShare: eight origins that filled the table (as
// names claiming a ten-minute lease and then falling silent would) no
// longer lock a ninth out: it books up to its fair share, each booking
// taking the place of one of the largest origin's, and the table's total
// stays within its bound.
func TestReplicaRemoteFairShare(t *testing.T) {
	b := newTestRouter(t, nil)
	addWorker(t, b, 1, nil)
	rm := b.Remote()
	const perOrigin = 100
	for o := range maxOriginsInFull {
		for i := range perOrigin {
			rm.Reserve(fmt.Sprint("hog", o), &BookingRecord{ID: fmt.Sprint(i), Rank: Rank{WorkerID: 1}, PrefillTokens: 5}, perOrigin)
		}
	}
	applied := 0
	for i := range perOrigin {
		if rm.Reserve("real", &BookingRecord{ID: fmt.Sprint(i), Rank: Rank{WorkerID: 1}, PrefillTokens: 7}, perOrigin) == RemoteApplied {
			applied++
		}
	}
	share := maxOriginsInFull * perOrigin / (maxOriginsInFull + 1)
	if applied != share || rm.Total() != maxOriginsInFull*perOrigin || rm.Evicted() != uint64(share) {
		t.Fatalf("the ninth origin booked %d (share %d); table %d, evicted %d", applied, share, rm.Total(), rm.Evicted())
	}
	counts := rm.Counts()
	for o := range maxOriginsInFull {
		if n := counts[fmt.Sprint("hog", o)]; n < share || n > perOrigin {
			t.Fatalf("hog%d holds %d; evictions should take no origin below its share of %d", o, n, share)
		}
	}
	// A booking for a rank this router lacks is refused before any room is
	// made: it evicted another's, then took nothing.
	evicted := rm.Evicted()
	if got := rm.Reserve("stranger", &BookingRecord{ID: "x", Rank: Rank{WorkerID: 77}, PrefillTokens: 7}, perOrigin); got != RemoteUnknownRank || rm.Evicted() != evicted {
		t.Fatalf("a booking for an unknown rank: %v, %d evicted; want unknown rank, none", got, rm.Evicted()-evicted)
	}
	// The load on the worker is what the table holds: 5 tokens a hog's
	// booking, 7 the real one's.
	want := uint64(5*(maxOriginsInFull*perOrigin-share) + 7*share)
	if got := loadOf(b, 1, 0).PotentialPrefillTokens; got != want {
		t.Fatalf("prefill load %d, want %d", got, want)
	}
}

func TestReplicaRemoteSessionLease(t *testing.T) {
	b := newTestRouter(t, func(c *Config) { c.SessionAffinityTTL = 60e9 })
	addWorker(t, b, 1, nil)
	addWorker(t, b, 2, nil)
	b.Remote().Reserve("a", &BookingRecord{ID: "x", Rank: Rank{WorkerID: 2}, PrefillTokens: 4096, Session: "chat"}, 0)
	resp, err := b.SelectAndReserve(&SelectRequest{Prompt: Prompt{BlockHashes: []uint64{1}, SequenceHashes: []uint64{1}, ISLTokens: ptr(uint64(16))},
		Placement: Placement{SessionID: "chat"}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.WorkerID != 2 {
		t.Fatalf("a session bound on replica A went to worker %d on B, not 2", resp.WorkerID)
	}
}

// TestRegistrationRecreatesTheRecord: a worker's Registration, upserted
// into another router of the same config, makes the same record; facts its
// registration did not give are left out for the other to read itself.
func TestRegistrationRecreatesTheRecord(t *testing.T) {
	cfg := DefaultConfig()
	cfg.UseKVEvents = false
	a, err := NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	id, ep, bs, dp := uint64(9), "127.0.0.1:9", uint32(16), uint32(2)
	req := &WorkerRequest{WorkerID: &id, Endpoint: &ep, BlockSize: &bs, DataParallelSize: &dp,
		Taints: []string{"gpu=a100"}, TopologyDomains: map[string]string{"zone": "z1"}, LoraAdapters: []string{"sql"}}
	rec, err := a.Catalog().UpsertWorker(req)
	if err != nil {
		t.Fatal(err)
	}
	reg := rec.Registration()
	if reg.MaxModelLen != nil || reg.ModelName != nil || reg.TotalKVBlocks != nil {
		t.Fatalf("facts not given are in the registration: %+v", reg)
	}
	got, err := b.Catalog().UpsertWorker(&reg)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rec) {
		t.Fatalf("recreated\n%+v\nwant\n%+v", got, rec)
	}
}
