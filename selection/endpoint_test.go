package selection

import (
	"errors"
	"slices"
	"sync"
	"testing"
)

// TestEndpointCheck: the check sees every new or changed endpoint, and
// only those; a refusal is a 422 with its text and changes nothing. It
// runs outside the router's locks, so it may read the catalog.
func TestEndpointCheck(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	var r *Router
	check := func(ep string) error {
		_ = r.ListWorkers("", "") // would deadlock under the router's locks
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
			_, err := r.UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(1)), Endpoint: ptr("10.0.0.1:8000"), BlockSize: ptr(uint32(16))})
			return err
		}, 0, []string{"10.0.0.1:8000"}},
		{"same endpoint again", func() error {
			_, err := r.UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(1)), Endpoint: ptr("10.0.0.1:8000"), BlockSize: ptr(uint32(16))})
			return err
		}, 0, nil},
		{"patch without endpoint", func() error {
			_, err := r.PatchWorker(1, &WorkerRequest{TotalKVBlocks: ptr(uint64(9))})
			return err
		}, 0, nil},
		{"no endpoint at all", func() error {
			_, err := r.UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(2)), BlockSize: ptr(uint32(16))})
			return err
		}, 0, nil},
		{"refused on a new worker", func() error {
			_, err := r.UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(3)), Endpoint: ptr("127.0.0.1:2019"), BlockSize: ptr(uint32(16))})
			return err
		}, 422, []string{"127.0.0.1:2019"}},
		{"refused on a patch", func() error {
			_, err := r.PatchWorker(1, &WorkerRequest{Endpoint: ptr("127.0.0.1:2019")})
			return err
		}, 422, []string{"127.0.0.1:2019"}},
		{"refused on an upsert", func() error {
			_, err := r.UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(1)), Endpoint: ptr("127.0.0.1:2019"), BlockSize: ptr(uint32(16))})
			return err
		}, 422, []string{"127.0.0.1:2019"}},
		{"a changed endpoint", func() error {
			_, err := r.PatchWorker(1, &WorkerRequest{Endpoint: ptr("10.0.0.2:8000")})
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
	if _, ok := r.Worker(3); ok {
		t.Fatal("a refused worker was stored")
	}
	if w, _ := r.Worker(1); *w.Endpoint != "10.0.0.2:8000" {
		t.Fatalf("endpoint %s", *w.Endpoint)
	}
}
