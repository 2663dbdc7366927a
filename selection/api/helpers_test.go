package api

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// The same fixtures as the selection package's tests: a router learning
// from bookings, with a seeded picker so runs repeat.

func ptr[T any](v T) *T { return &v }

func newTestRouter(t *testing.T, mutate func(*selection.Config)) *selection.Router {
	t.Helper()
	cfg := selection.DefaultConfig()
	cfg.UseKVEvents = false
	rng := rand.New(rand.NewPCG(7, 7))
	var mu sync.Mutex
	cfg.Rand = func() float64 { mu.Lock(); defer mu.Unlock(); return rng.Float64() }
	if mutate != nil {
		mutate(&cfg)
	}
	r, err := selection.NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

func addWorker(t *testing.T, r *selection.Router, id uint64, mutate func(*selection.WorkerRequest)) selection.WorkerRecord {
	t.Helper()
	req := &selection.WorkerRequest{WorkerID: ptr(id), Endpoint: ptr("127.0.0.1:9"), BlockSize: ptr(uint32(16))}
	if mutate != nil {
		mutate(req)
	}
	rec, err := r.UpsertWorker(req)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}
