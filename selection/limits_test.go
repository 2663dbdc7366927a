package selection

import (
	"strconv"
	"strings"
	"testing"
)

// TestRegistrationBounds sends registrations past each bound: each is
// refused with the status and reason, before anything is allocated for it
// (a data_parallel_size of 2^32-1 used to end the process in Ranks).
func TestRegistrationBounds(t *testing.T) {
	long := func(n int) *string { s := strings.Repeat("x", n); return &s }
	ranks := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[strconv.Itoa(i)] = "tcp://127.0.0.1:5557"
		}
		return m
	}
	manyTaints := make([]string, MaxTaints+1)
	tests := []struct {
		name   string
		req    func(*WorkerRequest)
		status int
		errSub string
	}{
		{"data_parallel_size 2^32-1", func(w *WorkerRequest) { w.DataParallelSize = ptr(uint32(4294967295)) },
			422, "data_parallel_size 4294967295 exceeds the bound of 256 ranks per worker (max_ranks_per_worker)"},
		{"data_parallel_size 257", func(w *WorkerRequest) { w.DataParallelSize = ptr(uint32(257)) }, 422, "max_ranks_per_worker"},
		{"rank overflow", func(w *WorkerRequest) {
			w.DataParallelStartRank, w.DataParallelSize = ptr(uint32(4294967290)), ptr(uint32(8))
		}, 422, "overflows a u32 rank"},
		{"model_name", func(w *WorkerRequest) { w.ModelName = long(MaxFieldBytes + 1) }, 422, "model_name is 257 bytes, more than the bound of 256"},
		{"routing_group", func(w *WorkerRequest) { w.RoutingGroup = long(MaxFieldBytes + 1) }, 422, "routing_group is 257 bytes"},
		{"tenant_id", func(w *WorkerRequest) { w.TenantID = long(MaxFieldBytes + 1) }, 422, "tenant_id is 257 bytes"},
		{"stable_routing_id", func(w *WorkerRequest) { w.StableRoutingID = long(MaxFieldBytes + 1) }, 422, "stable_routing_id"},
		{"kv_transfer_domain", func(w *WorkerRequest) { w.KVTransferDomain = long(MaxFieldBytes + 1) }, 422, "kv_transfer_domain"},
		{"kv_transfer_enforcement", func(w *WorkerRequest) { w.KVTransferEnforcement = long(MaxFieldBytes + 1) }, 422, "kv_transfer_enforcement"},
		{"router_hint_worker_type", func(w *WorkerRequest) { w.RouterHintWorkerType = long(MaxFieldBytes + 1) }, 422, "router_hint_worker_type"},
		{"endpoint", func(w *WorkerRequest) { w.Endpoint = long(MaxEndpointBytes + 1) }, 422, "endpoint is 2049 bytes, more than the bound of 2048"},
		{"kv_events_endpoint", func(w *WorkerRequest) { w.KVEventsEndpoint = long(MaxEndpointBytes + 1) }, 422, "kv_events_endpoint is 2049 bytes"},
		{"replay_endpoint", func(w *WorkerRequest) { w.ReplayEndpoint = long(MaxEndpointBytes + 1) }, 422, "replay_endpoint"},
		{"too many taints", func(w *WorkerRequest) { w.Taints = manyTaints }, 422, "taints has 65 entries, more than the bound of 64"},
		{"a long taint", func(w *WorkerRequest) { w.Taints = []string{"a", *long(MaxFieldBytes + 1)} }, 422, "taints[1] is 257 bytes"},
		{"topology_domains entries", func(w *WorkerRequest) { w.TopologyDomains = ranks(MaxMapEntries + 1) }, 422, "topology_domains has 65 entries"},
		{"topology_domains value", func(w *WorkerRequest) { w.TopologyDomains = map[string]string{"zone": *long(MaxFieldBytes + 1)} }, 422, "topology_domains value"},
		{"source control entries", func(w *WorkerRequest) { w.RouterHintSourceControl = ranks(MaxMapEntries + 1) }, 422, "router_hint_source_control_endpoints has 65 entries"},
		{"source control value", func(w *WorkerRequest) {
			w.RouterHintSourceControl = map[string]string{"a": *long(MaxEndpointBytes + 1)}
		}, 422, "router_hint_source_control_endpoints value is 2049 bytes"},
		{"more event endpoints than ranks", func(w *WorkerRequest) {
			w.DataParallelSize, w.KVEventsEndpoints = ptr(uint32(2)), ranks(3)
		}, 422, "kv_events_endpoints has 3 entries, more than data_parallel_size 2"},
		{"an event endpoint for another rank", func(w *WorkerRequest) {
			w.DataParallelStartRank, w.DataParallelSize = ptr(uint32(4)), ptr(uint32(2))
			w.KVEventsEndpoints = map[string]string{"4": "tcp://a:1", "6": "tcp://a:2"}
		}, 422, `kv_events_endpoints key "6" is not a dp_rank of the worker (4 to 5)`},
		{"max_model_len 2^61", func(w *WorkerRequest) { w.MaxModelLen = ptr(uint64(1) << 61) }, 422,
			"max_model_len 2305843009213693952 exceeds the bound of 67108864"},
		{"max_num_batched_tokens", func(w *WorkerRequest) { w.MaxNumBatchedTokens = ptr(uint64(MaxContextTokens + 1)) }, 422, "max_num_batched_tokens"},
		{"total_kv_blocks 2^64-1", func(w *WorkerRequest) { w.TotalKVBlocks = ptr(^uint64(0)) }, 422, "total_kv_blocks 18446744073709551615 exceeds"},
		{"a non-canonical rank key", func(w *WorkerRequest) { w.KVEventsEndpoints = map[string]string{"00": "tcp://a:1"} }, 422, `key "00"`},
		{"a long event endpoint", func(w *WorkerRequest) { w.KVEventsEndpoints = map[string]string{"0": *long(MaxEndpointBytes + 1)} }, 422, "kv_events_endpoints[0] is 2049 bytes"},
		// At the bounds: accepted.
		{"256 ranks", func(w *WorkerRequest) { w.DataParallelSize = ptr(uint32(256)); w.KVEventsEndpoints = ranks(256) }, 0, ""},
		{"the last ranks", func(w *WorkerRequest) {
			w.DataParallelStartRank, w.DataParallelSize = ptr(uint32(4294967290)), ptr(uint32(5))
		}, 0, ""},
		{"fields at their bounds", func(w *WorkerRequest) {
			w.ModelName, w.Endpoint, w.Taints = long(MaxFieldBytes), long(MaxEndpointBytes), make([]string, MaxTaints)
			w.TopologyDomains = ranks(MaxMapEntries)
		}, 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRouter(t, nil)
			req := &WorkerRequest{WorkerID: ptr(uint64(1)), Endpoint: ptr("127.0.0.1:9"), BlockSize: ptr(uint32(16))}
			tc.req(req)
			_, err := r.Catalog().UpsertWorker(req)
			if tc.status == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			mustStatus(t, err, tc.status, tc.errSub)
			if len(r.Catalog().ListWorkers("", "")) != 0 {
				t.Fatal("a refused worker is in the catalog")
			}
			// The same fields through a patch of a valid worker; a patch
			// ignores the partition's names (TestPatchKeepsThePartition).
			addWorker(t, r, 1, nil)
			_, err = r.Catalog().PatchWorker(1, req)
			if tc.name == "model_name" || tc.name == "routing_group" {
				if rec, _ := r.Catalog().Worker(1); err != nil || rec.ModelName != "default" || rec.RoutingGroup != "default" {
					t.Fatalf("a patch naming a partition: %v, the worker in %s:%s", err, rec.ModelName, rec.RoutingGroup)
				}
				return
			}
			mustStatus(t, err, tc.status, tc.errSub)
			if rec, _ := r.Catalog().Worker(1); rec.DataParallelSize != 1 || *rec.Endpoint != "127.0.0.1:9" {
				t.Fatalf("a refused patch changed the worker: %+v", rec)
			}
		})
	}
}

// TestPatchCannotRaiseRanks: a patch is checked on the merged record, so
// raising data_parallel_size alone, or shrinking it under its event
// endpoints, is refused.
func TestPatchCannotRaiseRanks(t *testing.T) {
	r := newTestRouter(t, nil)
	addWorker(t, r, 1, func(w *WorkerRequest) {
		w.DataParallelSize = ptr(uint32(2))
		w.KVEventsEndpoints = map[string]string{"0": "tcp://a:1", "1": "tcp://a:2"}
	})
	_, err := r.Catalog().PatchWorker(1, &WorkerRequest{DataParallelSize: ptr(uint32(1 << 20))})
	mustStatus(t, err, 422, "data_parallel_size 1048576 exceeds the bound of 256")
	_, err = r.Catalog().PatchWorker(1, &WorkerRequest{DataParallelSize: ptr(uint32(1))})
	mustStatus(t, err, 422, "kv_events_endpoints has 2 entries, more than data_parallel_size 1")
	if _, err := r.Catalog().PatchWorker(1, &WorkerRequest{DataParallelSize: ptr(uint32(4))}); err != nil {
		t.Fatal(err)
	}
}

// TestTotalRankBound: MaxRanks counts every record's ranks; a write past
// it is a 409, and a delete or a smaller worker makes room.
func TestTotalRankBound(t *testing.T) {
	r := newTestRouter(t, func(c *Config) { c.MaxRanks = 8; c.MaxRanksPerWorker = 4 })
	addWorker(t, r, 1, func(w *WorkerRequest) { w.DataParallelSize = ptr(uint32(4)) })
	addWorker(t, r, 2, func(w *WorkerRequest) { w.DataParallelSize = ptr(uint32(3)); w.Endpoint = nil }) // incomplete counts too
	_, err := r.Catalog().UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(3)), DataParallelSize: ptr(uint32(2))})
	mustStatus(t, err, 409, "worker catalog is full: 9 data-parallel ranks with this worker, more than max_ranks 8")
	addWorker(t, r, 3, nil) // exactly 8
	_, err = r.Catalog().PatchWorker(2, &WorkerRequest{DataParallelSize: ptr(uint32(4))})
	mustStatus(t, err, 409, "max_ranks 8")
	addWorker(t, r, 1, func(w *WorkerRequest) { w.DataParallelSize = ptr(uint32(2)) })
	addWorker(t, r, 4, func(w *WorkerRequest) { w.DataParallelSize = ptr(uint32(2)) })
	if _, err := r.Catalog().DeleteWorker(2); err != nil {
		t.Fatal(err)
	}
	addWorker(t, r, 5, func(w *WorkerRequest) { w.DataParallelSize = ptr(uint32(3)) })
}
