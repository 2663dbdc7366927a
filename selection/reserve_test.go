package selection

import (
	"regexp"
	"sync"
	"testing"
	"time"
)

func TestStaleReservationSweep(t *testing.T) {
	now := time.Unix(0, 0)
	var mu sync.Mutex
	cfg := DefaultConfig()
	cfg.UseKVEvents = false
	cfg.ReservationTTL = time.Hour
	r, err := NewRouter(cfg, WithClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now }))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	addWorker(t, r, 1, nil)
	book(t, r, "old", 1, 0, []uint64{1}, 16, 16)
	mu.Lock()
	now = now.Add(2 * time.Hour)
	mu.Unlock()
	book(t, r, "new", 1, 0, []uint64{2}, 16, 16)
	if n := r.Sweep(); n != 1 || r.ActiveReservations() != 1 {
		t.Fatalf("swept %d, %d left", n, r.ActiveReservations())
	}
	if l := loadOf(r, 1, 0); l.ActiveRequests != 1 || l.PotentialPrefillTokens != 16 {
		t.Fatalf("load after sweep %+v", l)
	}
}

func TestConcurrentBookings(t *testing.T) {
	r := newTestRouter(t, nil)
	for id := uint64(1); id <= 8; id++ {
		addWorker(t, r, id, nil)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				tokens := make([]uint32, 16*(1+i%8))
				tokens[0] = uint32(g)
				res, err := r.SelectAndReserve(&SelectRequest{Prompt: Prompt{TokenIDs: tokens}})
				if err != nil {
					t.Error(err)
					return
				}
				_ = r.PrefillComplete(res.SelectionID)
				_ = r.AddOutputBlock(res.SelectionID, nil)
				if err := r.Free(res.SelectionID); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 50 {
			addWorker(t, r, 9, func(w *WorkerRequest) { w.TotalKVBlocks = ptr(uint64(i)) })
			_ = r.Queries().Loads("", "")
		}
	}()
	wg.Wait()
	for _, m := range r.Queries().Loads("", "") {
		for _, l := range m.Loads {
			if l.ActiveRequests != 0 || l.PotentialPrefillTokens != 0 || l.PotentialDecodeBlocks != 0 {
				t.Fatalf("load left behind: %+v", l)
			}
		}
	}
}

func TestOutputBlockAndDecay(t *testing.T) {
	r := newTestRouter(t, nil)
	addWorker(t, r, 1, nil)
	book(t, r, "a", 1, 0, []uint64{1, 2, 3, 4}, 64, 64)
	book(t, r, "b", 1, 0, []uint64{1, 2}, 32, 32)
	if err := r.AddOutputBlock("a", nil); err != nil {
		t.Fatal(err)
	}
	if got := loadOf(r, 1, 0).PotentialDecodeBlocks; got != 5 {
		t.Fatalf("after one output block: %d, want 5", got)
	}
	mustStatus(t, r.AddOutputBlock("a", ptr(1.5)), 400, "decay_fraction must be between 0.0 and 1.0")
	// Decay 0: a's exclusive blocks (3, 4, two outputs) stop counting; the
	// shared prefix (1, 2) still counts once.
	if err := r.AddOutputBlock("a", ptr(0.0)); err != nil {
		t.Fatal(err)
	}
	if got := loadOf(r, 1, 0).PotentialDecodeBlocks; got != 2 {
		t.Fatalf("after decay: %d, want 2", got)
	}
	mustStatus(t, r.AddOutputBlock("zzz", nil), 404, "reservation zzz not found")
	_ = r.Free("a")
	_ = r.Free("b")
	if l := loadOf(r, 1, 0); l.PotentialDecodeBlocks != 0 || l.ActiveRequests != 0 {
		t.Fatalf("after frees: %+v", l)
	}
}

// liveIDs lists the committed bookings, for tests that free them all.
func (t *bookings) liveIDs() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ids []string
	for id, b := range t.reservations {
		if b != nil {
			ids = append(ids, id)
		}
	}
	return ids
}

// TestBookingsClaimRules checks the table's exactly-once rules on their
// own: an id is claimed once, an in-flight claim is not a booking (it can
// be neither looked up nor freed), unclaim gives back only a claim, and a
// committed booking is taken out exactly once; the client's count follows.
func TestBookingsClaimRules(t *testing.T) {
	r := newTestRouter(t, func(c *Config) { c.MaxReservationsPerClient = 1 })
	addWorker(t, r, 1, nil)
	bk := r.book
	if err := bk.claim("a", "c", 0); err != nil {
		t.Fatal(err)
	}
	mustStatus(t, bk.claim("a", "d", 0), 409, "already reserved")
	mustStatus(t, bk.claim("b", "c", 0), 429, "max_reservations_per_client")
	_, err := bk.lookup("a")
	mustStatus(t, err, 404, "not found")
	mustStatus(t, bk.free("a"), 404, "not found")
	bk.unclaim("a", "c", 0)
	if len(bk.reservations) != 0 || len(bk.clients) != 0 {
		t.Fatalf("unclaim left %v %v", bk.reservations, bk.clients)
	}
	if _, err := r.SelectAndReserve(&SelectRequest{SelectionID: "a", Client: "c", Prompt: Prompt{TokenIDs: []uint32{1}}}); err != nil {
		t.Fatal(err)
	}
	bk.unclaim("a", "c", 0) // a committed booking is not a claim: it stays
	if bk.active() != 1 || bk.clients["c"].bookings != 1 {
		t.Fatalf("unclaim took a committed booking: %d active, %v", bk.active(), bk.clients)
	}
	if err := bk.free("a"); err != nil {
		t.Fatal(err)
	}
	mustStatus(t, bk.free("a"), 404, "not found")
	if bk.active() != 0 || len(bk.clients) != 0 {
		t.Fatalf("free left %d active, %v", bk.active(), bk.clients)
	}
}

// TestNewSelectionIDIsUUIDv4: the written-out id is a lowercase UUID of
// version 4 and the RFC 4122 variant, and ids differ.
func TestNewSelectionIDIsUUIDv4(t *testing.T) {
	form := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 1000 {
		id := newSelectionID()
		if !form.MatchString(id) {
			t.Fatalf("%q is not a UUIDv4", id)
		}
		if seen[id] {
			t.Fatalf("%q twice", id)
		}
		seen[id] = true
	}
}

// TestReservationBlocksPerClient: a client's live bookings cover at most
// MaxReservationBlocksPerClient prompt blocks; past it a booking is a 429
// that books nothing, freeing makes room again, the proxy's bookings (no
// client) are not counted, and a client with nothing booked is forgotten.
func TestReservationBlocksPerClient(t *testing.T) {
	r := newTestRouter(t, func(c *Config) { c.MaxReservationBlocksPerClient = 10 })
	addWorker(t, r, 1, nil)
	book := func(id, client string, tokens int) error {
		_, err := r.SelectAndReserve(&SelectRequest{SelectionID: id, Client: client, Prompt: Prompt{TokenIDs: make([]uint32, tokens)}})
		return err
	}
	held := func(client string) clientHolds {
		r.book.mu.Lock()
		defer r.book.mu.Unlock()
		return r.book.clients[client]
	}
	// 64 tokens at 16 a block: 4 blocks a booking.
	for _, id := range []string{"a", "b"} {
		if err := book(id, "c", 64); err != nil {
			t.Fatal(err)
		}
	}
	if h := held("c"); h != (clientHolds{2, 8}) {
		t.Fatalf("two bookings of 4 blocks: holds %+v", h)
	}
	mustStatus(t, book("x", "c", 64), 429, "max_reservation_blocks_per_client")
	if h := held("c"); h != (clientHolds{2, 8}) || r.ActiveReservations() != 2 {
		t.Fatalf("the refused booking left holds %+v and %d reservations", h, r.ActiveReservations())
	}
	if err := book("y", "c", 32); err != nil { // 2 blocks: exactly at the bound
		t.Fatal(err)
	}
	if err := book("p", "", 1024); err != nil { // the proxy's: not counted
		t.Fatal(err)
	}
	if err := r.Free("a"); err != nil {
		t.Fatal(err)
	}
	if err := book("x", "c", 64); err != nil {
		t.Fatalf("after a free: %v", err)
	}
	for _, id := range []string{"b", "x", "y"} {
		if err := r.Free(id); err != nil {
			t.Fatal(err)
		}
	}
	if h := held("c"); h != (clientHolds{}) {
		t.Fatalf("everything freed: holds %+v", h)
	}
}
