package selection

import (
	"net"
	"sync"
	"testing"
	"time"
)

func TestWorkerDownAndBack(t *testing.T) {
	// Worker 1's address: taken now, released to be "dead", reused later.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	now := time.Unix(0, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	cfg := DefaultConfig()
	cfg.UseKVEvents = false
	cfg.WorkerDownAfter = 10 * time.Second
	r, err := NewRouter(cfg, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	addWorker(t, r, 1, func(w *WorkerRequest) { w.Endpoint = ptr(addr) })
	addWorker(t, r, 2, nil)
	prompt := &SelectRequest{Prompt: Prompt{TokenIDs: make([]uint32, 64)}, Placement: Placement{PinnedWorker: &PinnedWorker{WorkerID: 1}}}
	res, err := r.SelectAndReserve(prompt)
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Free(res.SelectionID)
	overlap := func() uint64 {
		res, err := r.Select(&SelectRequest{Prompt: Prompt{TokenIDs: make([]uint32, 64)}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Overlap.LongestMatched
	}
	if overlap() != 64 {
		t.Fatal("the booked prompt is not in the index")
	}

	// Failing, but within the grace: still a candidate.
	r.ReportFailure(1)
	advance(5 * time.Second)
	r.Sweep()
	if r.WorkerDown(1) {
		t.Fatal("down before the grace passed")
	}
	// A success clears the failures.
	r.ReportSuccess(1)
	advance(10 * time.Second)
	r.Sweep()
	if r.WorkerDown(1) {
		t.Fatal("down after a success")
	}

	// Failing for longer than the grace: out, and its index entries gone.
	r.ReportFailure(1)
	advance(11 * time.Second)
	r.Sweep()
	if !r.WorkerDown(1) {
		t.Fatal("not down after the grace")
	}
	if _, err := r.Select(prompt); StatusOf(err) != 503 {
		t.Fatalf("a down worker can still be pinned: %v", err)
	}
	for range 20 {
		res, err := r.Select(&SelectRequest{Prompt: Prompt{TokenIDs: make([]uint32, 64)}})
		if err != nil || res.WorkerID != 2 {
			t.Fatalf("selection went to %d (%v), want 2", res.WorkerID, err)
		}
	}
	if overlap() != 0 {
		t.Fatal("the down worker's index entries were kept")
	}
	// A reported success does not bring it back; a connection does.
	r.ReportSuccess(1)
	r.Sweep()
	if !r.WorkerDown(1) {
		t.Fatal("up again without a connection")
	}
	back, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("could not reuse %s: %v", addr, err)
	}
	defer back.Close()
	r.Sweep()
	if r.WorkerDown(1) {
		t.Fatal("still down though its endpoint accepts connections")
	}
	if _, err := r.Select(prompt); err != nil {
		t.Fatalf("the worker came back but cannot be pinned: %v", err)
	}
}
