package api

import (
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

func ptr[T any](v T) *T { return &v }

// newTestRouter is a router that learns prefixes from bookings. The tests
// here give each partition one worker, so no pick is left to chance.
func newTestRouter(t *testing.T, mutate func(*selection.Config)) *selection.Router {
	t.Helper()
	cfg := selection.DefaultConfig()
	cfg.UseKVEvents = false
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

// addWorker registers a schedulable worker (block size 16 unless mutate
// says otherwise).
func addWorker(t *testing.T, r *selection.Router, id uint64, mutate func(*selection.WorkerRequest)) selection.WorkerRecord {
	t.Helper()
	req := &selection.WorkerRequest{WorkerID: ptr(id), Endpoint: ptr("127.0.0.1:9"), BlockSize: ptr(uint32(16))}
	if mutate != nil {
		mutate(req)
	}
	rec, err := r.Catalog().UpsertWorker(req)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}
