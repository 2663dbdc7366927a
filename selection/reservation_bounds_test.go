package selection

import (
	"sync"
	"testing"
	"time"
)

func reserveFor(r *Router, client string, pin uint64) (*SelectResponse, error) {
	req := &SelectRequest{Client: client, Prompt: Prompt{TokenIDs: make([]uint32, 32)}}
	if pin != 0 {
		req.PinnedWorker = &PinnedWorker{WorkerID: pin}
	}
	return r.SelectAndReserve(req)
}

// TestReservationsPerRank: a rank at MaxReservationsPerRank is not a
// candidate for a booking; with none left the booking is a 503. Plain
// selections still answer, and a free makes room.
func TestReservationsPerRank(t *testing.T) {
	r := newTestRouter(t, func(c *Config) { c.MaxReservationsPerRank = 2 })
	addWorker(t, r, 1, nil)
	addWorker(t, r, 2, nil)
	var ids []string
	for i := range 4 {
		res, err := reserveFor(r, "", 0) // the proxy path is bounded too
		if err != nil {
			t.Fatalf("booking %d: %v", i, err)
		}
		ids = append(ids, res.SelectionID)
	}
	if loadOf(r, 1, 0).ActiveRequests != 2 || loadOf(r, 2, 0).ActiveRequests != 2 {
		t.Fatalf("bookings not spread to the bound: %+v %+v", loadOf(r, 1, 0), loadOf(r, 2, 0))
	}
	_, err := reserveFor(r, "", 0)
	mustStatus(t, err, 503, "every eligible worker of default:default holds 2 reservations, the most max_reservations_per_rank allows")
	_, err = r.CreateReservation(&ReservationRequest{SelectionID: ptr("x"), WorkerID: ptr(uint64(1)),
		Prompt: Prompt{SequenceHashes: Hashes{1}, ISLTokens: ptr(uint64(16))}})
	mustStatus(t, err, 503, "worker 1 dp_rank 0 holds 2 reservations")
	if _, err := r.Select(&SelectRequest{SelectionID: "later", Prompt: Prompt{TokenIDs: make([]uint32, 32)}}); err != nil {
		t.Fatalf("a plain select was refused: %v", err)
	}
	_, err = r.CreateReservation(&ReservationRequest{SelectionID: ptr("later")})
	mustStatus(t, err, 503, "max_reservations_per_rank")
	if r.ActiveReservations() != 4 {
		t.Fatalf("%d reservations, want 4", r.ActiveReservations())
	}
	var freed uint64
	for _, id := range ids {
		if b, _ := r.book.lookup(id); b.rs.rank.WorkerID == 1 {
			freed = 1
			_ = r.Free(id)
			break
		}
	}
	res, err := reserveFor(r, "", 0)
	if err != nil || res.WorkerID != freed {
		t.Fatalf("after a free: %+v %v", res, err)
	}
}

// TestReservationsPerClient: a client past MaxReservationsPerClient gets
// 429 on every kind of booking; other clients and the exempt proxy path
// do not; frees, the TTL sweep and an endpoint change give the count back,
// and failed bookings never take any.
func TestReservationsPerClient(t *testing.T) {
	now := time.Unix(0, 0)
	var mu sync.Mutex
	cfg := DefaultConfig()
	cfg.UseKVEvents = false
	cfg.MaxReservationsPerClient = 3
	r, err := NewRouter(cfg, WithClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now }))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	addWorker(t, r, 1, nil)
	addWorker(t, r, 2, nil)
	explicit := func(client, id string) error {
		_, err := r.CreateReservation(&ReservationRequest{Client: client, SelectionID: ptr(id), WorkerID: ptr(uint64(2)),
			Prompt: Prompt{SequenceHashes: Hashes{1}, ISLTokens: ptr(uint64(16))}})
		return err
	}
	cached := func(client, id string) error {
		if _, err := r.Select(&SelectRequest{SelectionID: id, Placement: Placement{PinnedWorker: &PinnedWorker{WorkerID: 2}},
			Prompt: Prompt{TokenIDs: make([]uint32, 32)}}); err != nil {
			return err
		}
		_, err := r.CreateReservation(&ReservationRequest{Client: client, SelectionID: ptr(id)})
		return err
	}
	// Failures take nothing: a duplicate id, an unknown worker, a missing
	// pending selection.
	if _, err := r.SelectAndReserve(&SelectRequest{Client: "a", SelectionID: "a1", Placement: Placement{PinnedWorker: &PinnedWorker{WorkerID: 1}},
		Prompt: Prompt{TokenIDs: make([]uint32, 32)}}); err != nil {
		t.Fatal(err)
	}
	_, err = r.SelectAndReserve(&SelectRequest{Client: "a", SelectionID: "a1", Prompt: Prompt{TokenIDs: make([]uint32, 32)}})
	mustStatus(t, err, 409, "already reserved")
	_, err = reserveFor(r, "a", 9)
	mustStatus(t, err, 503, "not eligible")
	_, err = r.CreateReservation(&ReservationRequest{Client: "a", SelectionID: ptr("none")})
	mustStatus(t, err, 404, "no pending selection")
	if err := explicit("a", "a2"); err != nil {
		t.Fatal(err)
	}
	if err := cached("a", "a3"); err != nil {
		t.Fatal(err)
	}
	const over = "client a holds 3 reservations, the most max_reservations_per_client allows"
	_, err = reserveFor(r, "a", 0)
	mustStatus(t, err, 429, over)
	mustStatus(t, explicit("a", "a4"), 429, over)
	mustStatus(t, cached("a", "a5"), 429, over)
	// Other clients, and the exempt empty client, still book.
	if _, err := reserveFor(r, "b", 0); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := reserveFor(r, "", 0); err != nil {
			t.Fatal(err)
		}
	}
	// A free gives one back.
	if err := r.Free("a2"); err != nil {
		t.Fatal(err)
	}
	if err := explicit("a", "a2"); err != nil {
		t.Fatalf("after a free: %v", err)
	}
	// An endpoint change drops a1, the only one on worker 1.
	addWorker(t, r, 1, func(w *WorkerRequest) { w.Endpoint = ptr("127.0.0.1:10") })
	if _, err := reserveFor(r, "a", 0); err != nil {
		t.Fatalf("after the endpoint change: %v", err)
	}
	_, err = reserveFor(r, "a", 0)
	mustStatus(t, err, 429, over)
	// The TTL sweep gives back everything.
	mu.Lock()
	now = now.Add(2 * cfg.ReservationTTL)
	mu.Unlock()
	r.Sweep()
	r.book.mu.Lock()
	left := len(r.book.clients)
	r.book.mu.Unlock()
	if left != 0 || r.ActiveReservations() != 0 {
		t.Fatalf("after the sweep: %d clients counted, %d reservations", left, r.ActiveReservations())
	}
	for i := range 3 {
		if _, err := reserveFor(r, "a", 0); err != nil {
			t.Fatalf("booking %d after the sweep: %v", i, err)
		}
	}
}
