package selection

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// poisoned turns on poisonFreedHashes for one test: a buffer whose last
// reader let go is overwritten, so a reader that kept it reads poison.
func poisoned(t *testing.T) {
	poisonFreedHashes = true
	t.Cleanup(func() { poisonFreedHashes = false })
}

// prefixedPrompt is prefix followed by blocks more blocks of tokens from
// rng.
func prefixedPrompt(prefix []uint32, blocks int, rng *rand.Rand) Prompt {
	toks := slices.Clone(prefix)
	for range blocks * 16 {
		toks = append(toks, rng.Uint32())
	}
	return Prompt{TokenIDs: toks}
}

// checkTrieHolds walks every partition's trie of r and fails when an edge
// reads poison (its buffer was given back while it still held it) or when
// a pooled buffer's count is not the number of edges and live bookings
// that hold it. It returns the pooled buffers still held.
func checkTrieHolds(t *testing.T, r *Router) map[*hashBuf]int32 {
	t.Helper()
	want := map[*hashBuf]int32{}
	r.book.mu.Lock()
	for _, b := range r.book.reservations {
		if b != nil && b.buf != nil {
			want[b.buf]++
		}
	}
	r.book.mu.Unlock()
	for _, p := range r.catalog.partitions("", "") {
		p.mu.Lock()
		var walk func(e *edge)
		walk = func(e *edge) {
			for _, c := range e.children {
				if slices.Contains(c.hashes, hashPoison) {
					t.Errorf("an edge of %s reads a buffer given back", p.key)
				}
				if c.buf != nil {
					want[c.buf]++
				}
				walk(c)
			}
		}
		walk(&p.load.root)
		p.mu.Unlock()
	}
	for buf, n := range want {
		if buf.refs != n {
			t.Errorf("a pooled buffer counts %d holders, %d hold it", buf.refs, n)
		}
	}
	return want
}

// A lean booking's hashes are pooled; the trie edges cut from them outlive
// the booking when a later booking of the same prefix holds them, and the
// buffer goes back only when its last edge leaves the trie.
func TestPooledHashesOutliveTheirBooking(t *testing.T) {
	poisoned(t)
	r := newTestRouter(t, nil)
	addWorker(t, r, 1, nil)
	rng := rand.New(rand.NewPCG(3, 4))
	prefix := prefixedPrompt(nil, 4, rng).TokenIDs

	first, err := r.Reserve(&SelectRequest{Prompt: prefixedPrompt(prefix, 2, rng), Lean: true}, false)
	if err != nil {
		t.Fatal(err)
	}
	if first.Response().SequenceHashes != nil {
		t.Fatal("a lean response carries the booking's pooled hashes")
	}
	second, err := r.Reserve(&SelectRequest{Prompt: prefixedPrompt(prefix, 2, rng), Lean: true}, false)
	if err != nil {
		t.Fatal(err)
	}
	b1, _ := r.book.lookup(first.Response().SelectionID)
	b2, _ := r.book.lookup(second.Response().SelectionID)
	buf1, buf2 := b1.buf, b2.buf
	if buf1 == nil || buf2 == nil {
		t.Fatal("lean bookings did not pool their hashes")
	}
	prefixHashes := slices.Clone(b2.hashes[:4])
	// The first booking's buffer: the booking, the shared prefix's edge
	// and the first booking's own tail.
	if got := checkTrieHolds(t, r)[buf1]; got != 3 {
		t.Fatalf("the first booking's buffer has %d holders, want 3", got)
	}

	first.Release()
	if got := checkTrieHolds(t, r)[buf1]; got != 1 {
		t.Fatalf("after the first booking is freed its buffer has %d holders, want 1 (the shared prefix)", got)
	}
	if b1.hashes != nil || b1.buf != nil {
		t.Fatal("a freed booking still refers to its pooled hashes")
	}
	p := r.catalog.partitions("", "")[0]
	p.mu.Lock()
	held := p.load.activeFor(prefixHashes, p.byRank[Rank{WorkerID: 1}])
	p.mu.Unlock()
	if held != 4 {
		t.Fatalf("the shared prefix reads as %d blocks held, want 4", held)
	}

	second.Release()
	if left := checkTrieHolds(t, r); len(left) != 0 {
		t.Fatalf("%d pooled buffers still held with no booking live", len(left))
	}
	if buf1.refs != 0 || buf2.refs != 0 {
		t.Fatalf("buffers not given back: %d and %d holders", buf1.refs, buf2.refs)
	}
}

// The selection API's booking keeps a fresh copy of its hashes, which its
// response shares; only lean (proxy) bookings pool them.
func TestSelectionAPIBookingsKeepTheirHashes(t *testing.T) {
	r := newTestRouter(t, nil)
	addWorker(t, r, 1, nil)
	resp, err := r.SelectAndReserve(&SelectRequest{Prompt: promptOf(rand.New(rand.NewPCG(5, 6)))})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := r.book.lookup(resp.SelectionID)
	if b.buf != nil || len(resp.SequenceHashes) == 0 || &resp.SequenceHashes[0] != &b.hashes[0] {
		t.Fatal("an API booking's response does not share its booking's own hashes")
	}
	if err := r.Free(resp.SelectionID); err != nil {
		t.Fatal(err)
	}
	if len(resp.SequenceHashes) == 0 {
		t.Fatal("an API response lost its hashes when the booking was freed")
	}
}

// keepingSink keeps every record it hears, to read them after their
// bookings are gone.
type keepingSink struct {
	mu      sync.Mutex
	records []*BookingRecord
}

func (s *keepingSink) Reserved(rec *BookingRecord) {
	s.mu.Lock()
	s.records = append(s.records, rec)
	s.mu.Unlock()
}
func (s *keepingSink) PrefillCompleted(string)      {}
func (s *keepingSink) OutputBlock(string, *float64) {}
func (s *keepingSink) Freed(string)                 {}
func (s *keepingSink) all() []*BookingRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.records)
}

var _ ReplicaSink = (*keepingSink)(nil)

// Many proxy bookings of prompts that share prefixes, booked and freed
// concurrently while replicas are told of them and re-announced: no edge
// ever reads a buffer given back, every buffer's count matches its
// holders, every buffer goes back once the bookings are gone, and the
// replica records (read after their bookings are freed) hold the hashes
// they were made with. Run it with -race: a reader outside the
// partition's lock races the buffer's next owner.
func TestPooledHashesUnderConcurrentBookings(t *testing.T) {
	poisoned(t)
	r := newTestRouter(t, nil)
	for id := uint64(1); id <= 3; id++ {
		addWorker(t, r, id, nil)
	}
	sink := new(keepingSink)
	r.SetReplicaSink(sink)
	rng := rand.New(rand.NewPCG(7, 8))
	prefixes := make([][]uint32, 4)
	for i := range prefixes {
		prefixes[i] = prefixedPrompt(nil, 1+i, rng).TokenIDs
	}
	const goroutines, rounds = 8, 150
	var wg sync.WaitGroup
	stop := make(chan struct{})
	go func() { // re-announces, as a replica that reconnects does
		for {
			select {
			case <-stop:
				return
			default:
				for _, rec := range r.LocalBookings() {
					if slices.Contains(rec.Hashes, hashPoison) {
						t.Error("a re-announced record reads a buffer given back")
						return
					}
				}
			}
		}
	}()
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			var held []*Reservation
			for range rounds {
				pr := prefixedPrompt(prefixes[rng.IntN(len(prefixes))], rng.IntN(3), rng)
				h, err := r.Reserve(&SelectRequest{Prompt: pr, Lean: true}, false)
				if err != nil {
					t.Error(err)
					return
				}
				held = append(held, h)
				if len(held) > 3 {
					k := rng.IntN(len(held))
					held[k].Release()
					held = slices.Delete(held, k, k+1)
				}
			}
			for _, h := range held {
				h.Release()
			}
		}()
	}
	wg.Wait()
	close(stop)
	if left := checkTrieHolds(t, r); len(left) != 0 {
		t.Fatalf("%d pooled buffers still held with no booking live", len(left))
	}
	records := sink.all()
	if len(records) != goroutines*rounds {
		t.Fatalf("the sink heard %d bookings, want %d", len(records), goroutines*rounds)
	}
	for _, rec := range records {
		if len(rec.Hashes) == 0 || slices.Contains(rec.Hashes, hashPoison) {
			t.Fatal("a replica record lost its hashes to a buffer given back")
		}
	}
}
