package selection

import (
	"testing"
)

func TestReadinessAndIncompleteWorkers(t *testing.T) {
	r := newTestRouter(t, nil)
	_, err := r.Select(&SelectRequest{Prompt: Prompt{TokenIDs: []uint32{1}}})
	mustStatus(t, err, 503, "no schedulable workers for default:default")
	rec := addWorker(t, r, 3, func(w *WorkerRequest) { w.Endpoint = nil; w.BlockSize = ptr(uint32(0)) })
	if rec.Lifecycle != LifecycleIncomplete || len(rec.NotSchedulableReasons) != 2 ||
		rec.NotSchedulableReasons[0] != "endpoint is required" || rec.NotSchedulableReasons[1] != "block_size must be greater than 0" {
		t.Fatalf("incomplete record %+v", rec)
	}
	if r.Catalog().Ready().Ready {
		t.Fatal("ready with only an incomplete worker")
	}
	rec = addWorker(t, r, 4, func(w *WorkerRequest) {
		w.DataParallelSize = ptr(uint32(2))
		w.ReplayEndpoint = ptr("tcp://127.0.0.1:5558")
	})
	if rec.Lifecycle != LifecycleIncomplete || rec.NotSchedulableReasons[0] != "replay_endpoint is supported only for data_parallel_size 1" {
		t.Fatalf("multi-rank replay record %+v", rec)
	}
	addWorker(t, r, 5, nil)
	if rr := r.Catalog().Ready(); !rr.Ready || rr.SchedulableWorkers != 1 || len(rr.Workers) != 3 {
		t.Fatalf("ready %+v", rr)
	}
}

func TestEventModeReasons(t *testing.T) {
	cfg := DefaultConfig()
	cfg.UseKVEvents = true
	rec := newWorkerRecord(1, &cfg)
	rec.applyRequest(&WorkerRequest{Endpoint: ptr("a:1"), BlockSize: ptr(uint32(16)), DataParallelSize: ptr(uint32(2)),
		KVEventsEndpoints: map[string]string{"0": "tcp://127.0.0.1:5557"}})
	rec.validate(&cfg)
	if rec.Schedulable() || len(rec.NotSchedulableReasons) != 1 || rec.NotSchedulableReasons[0] != "kv_events endpoint is required for dp_rank 1" {
		t.Fatalf("%+v", rec.NotSchedulableReasons)
	}
	if _, err := NewRouter(cfg); err == nil {
		t.Fatal("event mode without an indexer must be refused")
	}
}

func TestPartitionConflictsAndMoves(t *testing.T) {
	r := newTestRouter(t, nil)
	addWorker(t, r, 1, nil)
	_, err := r.Catalog().UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(2)), Endpoint: ptr("b:1"), BlockSize: ptr(uint32(32))})
	mustStatus(t, err, 409, "block_size 32 conflicts")
	_, err = r.Catalog().UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(2)), Endpoint: ptr("b:1"), BlockSize: ptr(uint32(16)), IsEagle: ptr(true)})
	mustStatus(t, err, 409, "is_eagle true conflicts")
	// Re-upserting the only worker with a new block size is allowed.
	addWorker(t, r, 1, func(w *WorkerRequest) { w.BlockSize = ptr(uint32(32)) })
	// Moving a worker to another routing group moves it.
	addWorker(t, r, 1, func(w *WorkerRequest) { w.RoutingGroup = ptr("g2") })
	if _, err := r.Select(&SelectRequest{Prompt: Prompt{TokenIDs: []uint32{1}}}); StatusOf(err) != 503 {
		t.Fatalf("old partition still schedulable: %v", err)
	}
	res, err := r.Select(&SelectRequest{Partition: Partition{RoutingGroup: "g2"}, Prompt: Prompt{TokenIDs: []uint32{1}}})
	if err != nil || res.WorkerID != 1 || res.RoutingGroup != "g2" {
		t.Fatalf("moved worker: %+v %v", res, err)
	}
	// tenant_id is read as the older name of routing_group.
	if _, err := r.Select(&SelectRequest{Partition: Partition{TenantID: "g2"}, Prompt: Prompt{TokenIDs: []uint32{1}}}); err != nil {
		t.Fatal(err)
	}
	rec, err := r.Catalog().DeleteWorker(1)
	if err != nil || rec.Lifecycle != LifecycleUnschedulable {
		t.Fatalf("delete: %+v %v", rec, err)
	}
	_, err = r.Catalog().DeleteWorker(1)
	mustStatus(t, err, 404, "worker 1 not found")
	_, err = r.Catalog().PatchWorker(9, &WorkerRequest{})
	mustStatus(t, err, 404, "worker 9 not found")
}

func TestPatchKeepsBookings(t *testing.T) {
	r := newTestRouter(t, nil)
	addWorker(t, r, 1, nil)
	book(t, r, "a", 1, 0, []uint64{1, 2}, 32, 32)
	rec, err := r.Catalog().PatchWorker(1, &WorkerRequest{TotalKVBlocks: ptr(uint64(100))})
	if err != nil || *rec.TotalKVBlocks != 100 || *rec.Endpoint != "127.0.0.1:9" {
		t.Fatalf("patch: %+v %v", rec, err)
	}
	if l := loadOf(r, 1, 0); l.ActiveRequests != 1 || l.PotentialDecodeBlocks != 2 {
		t.Fatalf("patch lost bookings: %+v", l)
	}
}

func TestCatalogCap(t *testing.T) {
	r := newTestRouter(t, func(c *Config) { c.MaxWorkers = 2 })
	addWorker(t, r, 1, nil)
	addWorker(t, r, 2, nil)
	_, err := r.Catalog().UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(3)), Endpoint: ptr("c:1"), BlockSize: ptr(uint32(16))})
	mustStatus(t, err, 409, "worker catalog is full (2 workers)")
	// Updating a worker already in the catalog is not refused.
	addWorker(t, r, 2, func(w *WorkerRequest) { w.TotalKVBlocks = ptr(uint64(5)) })
	if _, err := r.Catalog().DeleteWorker(1); err != nil {
		t.Fatal(err)
	}
	addWorker(t, r, 3, nil)
}

// TestCatalogVersionAndPartitions checks that every committed write moves
// the version (callers cache what they derive from it) and a refused one
// does not, and that partitions filters by model and group.
func TestCatalogVersionAndPartitions(t *testing.T) {
	r := newTestRouter(t, nil)
	c := r.Catalog()
	v := c.Version()
	addWorker(t, r, 1, nil)
	addWorker(t, r, 2, func(w *WorkerRequest) { w.ModelName = ptr("m2") })
	if c.Version() != v+2 {
		t.Fatalf("version %d after two writes from %d", c.Version(), v)
	}
	if n := len(c.partitions("", "")); n != 2 {
		t.Fatalf("%d partitions, want 2", n)
	}
	if ps := c.partitions("m2", ""); len(ps) != 1 || ps[0].key.Model != "m2" {
		t.Fatalf("model filter: %v", ps)
	}
	if ps := c.partitions("", "nope"); len(ps) != 0 {
		t.Fatalf("group filter: %v", ps)
	}
	v = c.Version()
	if _, err := c.PatchWorker(9, &WorkerRequest{}); err == nil {
		t.Fatal("patch of an unknown worker succeeded")
	}
	if _, err := c.DeleteWorker(2); err != nil {
		t.Fatal(err)
	}
	if c.Version() != v+1 {
		t.Fatalf("version %d: a refused write moved it or a delete did not", c.Version())
	}
}
