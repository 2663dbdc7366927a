package selection

import (
	"slices"
	"testing"
)

// TestAdapterResolution: an adapter name resolves to the base model its
// workers serve it under; a base model's name is never an adapter's; the
// routes follow registrations, patches and deletions.
func TestAdapterResolution(t *testing.T) {
	r := newTestRouter(t, nil)
	c := r.Catalog()
	if _, ok := c.AdapterBase("a1"); ok {
		t.Fatal("an empty catalog resolved an adapter")
	}
	addWorker(t, r, 1, func(w *WorkerRequest) { w.ModelName, w.LoraAdapters = ptr("m"), []string{"a1", "shared"} })
	addWorker(t, r, 2, func(w *WorkerRequest) { w.ModelName, w.LoraAdapters = ptr("m"), []string{"a2"} })
	addWorker(t, r, 3, func(w *WorkerRequest) { w.ModelName, w.LoraAdapters = ptr("n"), []string{"shared", "m", "n3"} })
	for name, want := range map[string]string{"a1": "m", "a2": "m", "n3": "n", "shared": "m", "m": "", "n": "", "nope": ""} {
		if base, ok := c.AdapterBase(name); base != want || ok != (want != "") {
			t.Errorf("AdapterBase(%q) = %q, %v; want %q", name, base, ok, want)
		}
	}
	// "shared" has one worker under each base: the smaller name wins the
	// tie, the base with more workers wins otherwise.
	addWorker(t, r, 4, func(w *WorkerRequest) { w.ModelName, w.LoraAdapters = ptr("n"), []string{"shared"} })
	if base, _ := c.AdapterBase("shared"); base != "n" {
		t.Errorf("shared resolves to %q, want n (two workers)", base)
	}
	// A worker that stops serving an adapter, or leaves, takes its route.
	if _, err := c.PatchWorker(1, &WorkerRequest{LoraAdapters: []string{}}); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.AdapterBase("a1"); ok {
		t.Error("a1 still resolves after its only worker dropped it")
	}
	if _, err := c.DeleteWorker(2); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.AdapterBase("a2"); ok {
		t.Error("a2 still resolves after its only worker left")
	}
	// A base model named like an adapter takes the name over.
	addWorker(t, r, 5, func(w *WorkerRequest) { w.ModelName = ptr("n3") })
	if _, ok := c.AdapterBase("n3"); ok {
		t.Error("n3 resolves as an adapter while a worker serves it as a base model")
	}
	if _, err := c.DeleteWorker(5); err != nil {
		t.Fatal(err)
	}
	if base, _ := c.AdapterBase("n3"); base != "n" {
		t.Errorf("n3 resolves to %q once the base model left, want n", base)
	}
	rec, _ := c.Worker(3)
	if !rec.ServesAdapter("n3") || rec.ServesAdapter("a1") {
		t.Errorf("ServesAdapter on %v", rec.LoraAdapters)
	}
}

// TestAdapterRequestsGoOnlyToWorkersServingIt: the adapter's taint is a
// required constraint that only its workers meet, whatever their load.
func TestAdapterRequestsGoOnlyToWorkersServingIt(t *testing.T) {
	r := newTestRouter(t, nil)
	addWorker(t, r, 1, func(w *WorkerRequest) { w.ModelName = ptr("m") })
	addWorker(t, r, 2, func(w *WorkerRequest) { w.ModelName, w.LoraAdapters = ptr("m"), []string{"sql"} })
	addWorker(t, r, 3, func(w *WorkerRequest) { w.ModelName, w.LoraAdapters = ptr("m"), []string{"chat", "sql"} })
	seen := map[uint64]int{}
	var held []*Reservation
	for i := range 60 {
		h, err := r.Reserve(&SelectRequest{Partition: Partition{ModelName: "m"},
			Prompt:    Prompt{TokenIDs: []uint32{uint32(i), 2, 3, 4}, LoraName: "sql"},
			Placement: Placement{RoutingConstraints: &RoutingConstraints{RequiredTaints: []string{AdapterTaint("sql")}}}}, false)
		if err != nil {
			t.Fatal(err)
		}
		seen[h.Response().WorkerID]++
		held = append(held, h) // held, so load spreads them
	}
	if seen[1] != 0 || seen[2] == 0 || seen[3] == 0 {
		t.Fatalf("adapter requests by worker: %v", seen)
	}
	for _, h := range held {
		h.Release()
	}
	_, err := r.Select(&SelectRequest{Partition: Partition{ModelName: "m"}, Prompt: Prompt{TokenIDs: []uint32{1}},
		Placement: Placement{RoutingConstraints: &RoutingConstraints{RequiredTaints: []string{AdapterTaint("none")}}}})
	mustStatus(t, err, 503, "all eligible workers were filtered")
}

// TestServedModels: every base model once, then every adapter once with
// its parent, from schedulable workers only; the smallest context length.
func TestServedModels(t *testing.T) {
	r := newTestRouter(t, nil)
	addWorker(t, r, 1, func(w *WorkerRequest) {
		w.ModelName, w.LoraAdapters, w.MaxModelLen = ptr("m"), []string{"sql", "m"}, ptr(uint64(8192))
	})
	addWorker(t, r, 2, func(w *WorkerRequest) {
		w.ModelName, w.LoraAdapters, w.MaxModelLen = ptr("m"), []string{"chat", "sql"}, ptr(uint64(4096))
	})
	addWorker(t, r, 3, func(w *WorkerRequest) { w.ModelName = ptr("b") })
	addWorker(t, r, 4, func(w *WorkerRequest) {
		w.ModelName, w.LoraAdapters, w.Endpoint = ptr("hidden"), []string{"ghost"}, nil
	})
	want := []ServedModel{{ID: "b"}, {ID: "m", MaxModelLen: 4096}, {ID: "chat", Parent: "m"}, {ID: "sql", Parent: "m"}}
	if got := r.Catalog().ServedModels(); !slices.Equal(got, want) {
		t.Fatalf("served models:\n got %+v\nwant %+v", got, want)
	}
}

// TestAdapterBaseUnderConcurrentWrites: the proxy path's lock-free lookup
// while workers come, change adapters and go (run with -race).
func TestAdapterBaseUnderConcurrentWrites(t *testing.T) {
	r := newTestRouter(t, nil)
	c := r.Catalog()
	addWorker(t, r, 1, func(w *WorkerRequest) { w.ModelName, w.LoraAdapters = ptr("m"), []string{"stay"} })
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			id := uint64(2 + i%5)
			if i%3 == 2 {
				_, _ = c.DeleteWorker(id)
				continue
			}
			_, _ = c.UpsertWorker(&WorkerRequest{WorkerID: ptr(id), Endpoint: ptr("127.0.0.1:9"), BlockSize: ptr(uint32(16)),
				ModelName: ptr("m"), LoraAdapters: []string{"a", string(rune('b' + i%7))}})
		}
	}()
	for {
		select {
		case <-done:
			if base, ok := c.AdapterBase("stay"); !ok || base != "m" {
				t.Fatalf("stay resolves to %q, %v", base, ok)
			}
			return
		default:
		}
		if base, ok := c.AdapterBase("stay"); !ok || base != "m" {
			t.Fatalf("stay resolves to %q, %v mid-way", base, ok)
		}
		if base, ok := c.AdapterBase("a"); ok && base != "m" {
			t.Fatalf("a resolves to %q", base)
		}
	}
}
