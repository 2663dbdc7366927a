package selection

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestEndpointCheck: the check sees every new or changed endpoint, and
// only those; a refusal is a 422 with its text and changes nothing. It
// runs outside the router's locks, so it may read the catalog.
func TestEndpointCheck(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	var r *Router
	check := func(ep string) error {
		_ = r.Catalog().ListWorkers("", "") // would deadlock under the router's locks
		mu.Lock()
		seen = append(seen, ep)
		mu.Unlock()
		if ep == "127.0.0.1:2019" {
			return errors.New("endpoint 127.0.0.1:2019 is the gateway's admin listener")
		}
		return nil
	}
	cfg := DefaultConfig()
	cfg.UseKVEvents = false
	r, err := NewRouter(cfg, WithEndpointCheck(check))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	calls := func() []string { mu.Lock(); defer mu.Unlock(); out := seen; seen = nil; return out }

	steps := []struct {
		name   string
		write  func() error
		status int
		calls  []string
	}{
		{"new worker", func() error {
			_, err := r.Catalog().UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(1)), Endpoint: ptr("10.0.0.1:8000"), BlockSize: ptr(uint32(16))})
			return err
		}, 0, []string{"10.0.0.1:8000"}},
		{"same endpoint again", func() error {
			_, err := r.Catalog().UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(1)), Endpoint: ptr("10.0.0.1:8000"), BlockSize: ptr(uint32(16))})
			return err
		}, 0, nil},
		{"patch without endpoint", func() error {
			_, err := r.Catalog().PatchWorker(1, &WorkerRequest{TotalKVBlocks: ptr(uint64(9))})
			return err
		}, 0, nil},
		{"no endpoint at all", func() error {
			_, err := r.Catalog().UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(2)), BlockSize: ptr(uint32(16))})
			return err
		}, 0, nil},
		{"refused on a new worker", func() error {
			_, err := r.Catalog().UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(3)), Endpoint: ptr("127.0.0.1:2019"), BlockSize: ptr(uint32(16))})
			return err
		}, 422, []string{"127.0.0.1:2019"}},
		{"refused on a patch", func() error {
			_, err := r.Catalog().PatchWorker(1, &WorkerRequest{Endpoint: ptr("127.0.0.1:2019")})
			return err
		}, 422, []string{"127.0.0.1:2019"}},
		{"refused on an upsert", func() error {
			_, err := r.Catalog().UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(1)), Endpoint: ptr("127.0.0.1:2019"), BlockSize: ptr(uint32(16))})
			return err
		}, 422, []string{"127.0.0.1:2019"}},
		{"a changed endpoint", func() error {
			_, err := r.Catalog().PatchWorker(1, &WorkerRequest{Endpoint: ptr("10.0.0.2:8000")})
			return err
		}, 0, []string{"10.0.0.2:8000"}},
	}
	for _, s := range steps {
		err := s.write()
		if s.status == 0 && err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if s.status != 0 {
			mustStatus(t, err, s.status, "is the gateway's admin listener")
		}
		if got := calls(); !slices.Equal(got, s.calls) {
			t.Fatalf("%s: checked %q, want %q", s.name, got, s.calls)
		}
	}
	if _, ok := r.Catalog().Worker(3); ok {
		t.Fatal("a refused worker was stored")
	}
	if w, _ := r.Catalog().Worker(1); *w.Endpoint != "10.0.0.2:8000" {
		t.Fatalf("endpoint %s", *w.Endpoint)
	}
}

// TestChangedEndpointIsANewServer: a worker with cached blocks, a booking,
// a session, a pending selection and failures is re-registered (or
// patched) with another endpoint. The new server inherits none of it.
func TestChangedEndpointIsANewServer(t *testing.T) {
	for _, via := range []string{"upsert", "patch"} {
		t.Run(via, func(t *testing.T) {
			r := newTestRouter(t, func(c *Config) { c.SessionAffinityTTL = time.Hour })
			addWorker(t, r, 1, nil)
			addWorker(t, r, 2, nil)
			tokens := make([]uint32, 64)
			res, err := r.SelectAndReserve(&SelectRequest{SelectionID: "b1", Prompt: Prompt{TokenIDs: tokens},
				Placement: Placement{SessionID: "s", PinnedWorker: &PinnedWorker{WorkerID: 1}}})
			if err != nil || res.WorkerID != 1 {
				t.Fatalf("booking: %+v %v", res, err)
			}
			if _, err := r.Select(&SelectRequest{SelectionID: "p1", Prompt: Prompt{TokenIDs: tokens},
				Placement: Placement{PinnedWorker: &PinnedWorker{WorkerID: 1}}}); err != nil {
				t.Fatal(err)
			}
			r.Health().ReportFailure(1)
			cached := func() uint32 {
				sc, err := r.Queries().OverlapScores(&ScoreRequest{Prompt: Prompt{TokenIDs: tokens}})
				if err != nil {
					t.Fatal(err)
				}
				for _, w := range sc.Workers {
					if w.WorkerID == 1 {
						return w.DeviceBlocks
					}
				}
				t.Fatal("worker 1 is not scored")
				return 0
			}
			session := func() bool { _, ok := r.affinity.bound(sessionKey{PartitionKey{"default", "default"}, "s"}); return ok }
			if cached() != 4 || loadOf(r, 1, 0).ActiveRequests != 1 || !session() {
				t.Fatalf("before: cached %d, load %+v, session %v", cached(), loadOf(r, 1, 0), session())
			}

			if via == "upsert" {
				addWorker(t, r, 1, func(w *WorkerRequest) { w.Endpoint = ptr("127.0.0.1:10") })
			} else if _, err := r.Catalog().PatchWorker(1, &WorkerRequest{Endpoint: ptr("127.0.0.1:10")}); err != nil {
				t.Fatal(err)
			}

			if n := cached(); n != 0 {
				t.Errorf("the new server inherited %d cached blocks", n)
			}
			if l := loadOf(r, 1, 0); l.ActiveRequests != 0 || l.PotentialPrefillTokens != 0 || l.PotentialDecodeBlocks != 0 {
				t.Errorf("the new server inherited load %+v", l)
			}
			if session() {
				t.Error("the session is still bound to the new server")
			}
			mustStatus(t, r.Free("b1"), 404, "reservation b1 not found")
			_, err = r.CreateReservation(&ReservationRequest{SelectionID: ptr("p1")})
			mustStatus(t, err, 404, "no pending selection p1")
			r.health.mu.Lock()
			_, failing := r.health.workers[1]
			r.health.mu.Unlock()
			if failing {
				t.Error("the new server inherited the old one's failures")
			}
			if r.ActiveReservations() != 0 {
				t.Errorf("%d reservations left", r.ActiveReservations())
			}
			// The worker is schedulable at its new endpoint.
			res, err = r.Select(&SelectRequest{Prompt: Prompt{TokenIDs: tokens}, Placement: Placement{PinnedWorker: &PinnedWorker{WorkerID: 1}}})
			if err != nil || res.Endpoint != "127.0.0.1:10" {
				t.Fatalf("after: %+v %v", res, err)
			}
		})
	}
}
