package selection

import (
	"testing"
	"time"
)

// Every worker past the prefill threshold makes the partition busy; a
// freed prefill, or one worker under it, makes it not busy.
func TestPartitionBusyPrefillThreshold(t *testing.T) {
	r := newTestRouter(t, func(c *Config) { c.PrefillBusyThreshold = ptr(0.5) })
	for id := uint64(1); id <= 2; id++ {
		addWorker(t, r, id, func(w *WorkerRequest) { w.MaxNumBatchedTokens = ptr(uint64(100)) })
	}
	part := Partition{}
	busy := func() bool { b, _ := r.PartitionBusy(part, nil); return b }
	if busy() {
		t.Fatal("an idle partition is busy")
	}
	var ids []string
	for id := uint64(1); id <= 2; id++ {
		res, err := r.SelectAndReserve(&SelectRequest{Prompt: Prompt{TokenIDs: make([]uint32, 64)},
			Placement: Placement{PinnedWorker: &PinnedWorker{WorkerID: id}}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.SelectionID)
		if busy := busy(); busy != (id == 2) {
			t.Fatalf("after booking %d of 2 workers past the threshold: busy %v", id, busy)
		}
	}
	if err := r.PrefillComplete(ids[0]); err != nil {
		t.Fatal(err)
	}
	if busy() {
		t.Fatal("busy after a worker's prefill completed")
	}
}

// A request that may go only to some workers (an allowed set, required
// taints) finds the partition busy when those are, however idle the
// others: it waits for them rather than going on to a 503.
func TestPartitionBusyAmongTheRequestsWorkers(t *testing.T) {
	r := newTestRouter(t, nil)
	addWorker(t, r, 1, nil)
	addWorker(t, r, 2, func(w *WorkerRequest) { w.Taints = []string{"t"} })
	part := Partition{}
	r.Health().ReportBusy(2, time.Hour)
	onlyTwo := &Placement{AllowedSet: map[uint64]bool{2: true}}
	tainted := &Placement{RoutingConstraints: &RoutingConstraints{RequiredTaints: []string{"t"}}}
	for _, tc := range []struct {
		what string
		pl   *Placement
		want bool
	}{
		{"any worker", nil, false},
		{"worker 2 only", onlyTwo, true},
		{"the taint's workers", tainted, true},
		{"no worker allowed", &Placement{AllowedSet: map[uint64]bool{9: true}}, false},
		{"worker 1 only", &Placement{AllowedSet: map[uint64]bool{1: true}}, false},
	} {
		if busy, _ := r.PartitionBusy(part, tc.pl); busy != tc.want {
			t.Errorf("%s: busy %v, want %v", tc.what, busy, tc.want)
		}
	}
}

// A worker's own busy mark counts until it runs out, and does not make
// it a failing worker.
func TestReportBusyMarksForItsDuration(t *testing.T) {
	now := time.Unix(0, 0)
	cfg := DefaultConfig()
	cfg.UseKVEvents = false
	r, err := NewRouter(cfg, WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	addWorker(t, r, 1, nil)
	busy := func(model string) bool {
		b, exists := r.PartitionBusy(Partition{ModelName: model}, nil)
		if exists != (model == "") {
			t.Fatalf("partition %q exists: %v", model, exists)
		}
		return b
	}
	r.Health().ReportBusy(1, 2*time.Second)
	r.Health().ReportBusy(1, time.Second) // shorter: does not shorten the mark
	if !busy("") || !r.Health().MarkedBusy(1) {
		t.Fatal("a worker that said it is busy is not busy")
	}
	if r.Health().WorkerDown(1) {
		t.Fatal("a busy worker is down")
	}
	now = now.Add(1500 * time.Millisecond)
	if !busy("") {
		t.Fatal("the shorter mark replaced the longer one")
	}
	now = now.Add(time.Second)
	if busy("") || r.Health().MarkedBusy(1) {
		t.Fatal("still busy after the mark ran out")
	}
	if busy("nobody-serves-this") {
		t.Fatal("a partition without workers is busy")
	}
}
