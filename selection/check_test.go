package selection

import (
	"net/http"
	"strings"
	"testing"
)

func TestCheckWorkers(t *testing.T) {
	// w is a complete one-rank worker of the default partition.
	w := func(id uint64, mutate func(*WorkerRequest)) *WorkerRequest {
		req := &WorkerRequest{WorkerID: ptr(id), Endpoint: ptr("127.0.0.1:9"), BlockSize: ptr(uint32(16))}
		if mutate != nil {
			mutate(req)
		}
		return req
	}
	long := strings.Repeat("m", MaxFieldBytes+1)
	for _, tc := range []struct {
		name   string
		cfg    func(*Config) // nil: DefaultConfig in approximate mode
		reqs   []*WorkerRequest
		status int    // 0: no error
		want   string // the whole message
		// incomplete: the catalog takes the worker, as incomplete with this
		// first reason, where CheckWorkers refuses it.
		incomplete bool
	}{
		{name: "none"},
		{name: "complete workers", reqs: []*WorkerRequest{w(1, nil), w(2, nil),
			w(3, func(r *WorkerRequest) { r.ModelName, r.BlockSize = ptr("m"), ptr(uint32(32)) })}},
		{name: "default block size", cfg: func(c *Config) { c.DefaultBlockSize = 16 },
			reqs: []*WorkerRequest{w(1, func(r *WorkerRequest) { r.BlockSize = nil })}},
		{name: "event mode leaves kv_events to the catalog", cfg: func(c *Config) { c.UseKVEvents = true },
			reqs: []*WorkerRequest{w(1, nil), w(2, func(r *WorkerRequest) { r.KVEventsEndpoint = ptr("http://x") })}},

		{name: "no worker_id", reqs: []*WorkerRequest{w(1, nil), {Endpoint: ptr("a:1")}},
			status: http.StatusUnprocessableEntity, want: "workers[1]: missing field `worker_id`"},
		{name: "duplicate", reqs: []*WorkerRequest{w(1, nil), w(1, nil)},
			status: http.StatusUnprocessableEntity, want: "worker 1: declared more than once"},
		{name: "no endpoint", reqs: []*WorkerRequest{w(1, func(r *WorkerRequest) { r.Endpoint = nil })},
			status: http.StatusUnprocessableEntity, want: "worker 1: endpoint is required", incomplete: true},
		{name: "no block size", reqs: []*WorkerRequest{w(1, func(r *WorkerRequest) { r.BlockSize = nil })},
			status: http.StatusUnprocessableEntity, want: "worker 1: block_size is required", incomplete: true},
		{name: "zero block size", reqs: []*WorkerRequest{w(1, func(r *WorkerRequest) { r.BlockSize = ptr(uint32(0)) })},
			status: http.StatusUnprocessableEntity, want: "worker 1: block_size must be greater than 0", incomplete: true},
		{name: "zero ranks", reqs: []*WorkerRequest{w(1, func(r *WorkerRequest) { r.DataParallelSize = ptr(uint32(0)) })},
			status: http.StatusUnprocessableEntity, want: "worker 1: data_parallel_size must be greater than 0", incomplete: true},
		{name: "replay on two ranks", reqs: []*WorkerRequest{w(1, func(r *WorkerRequest) {
			r.DataParallelSize, r.ReplayEndpoint = ptr(uint32(2)), ptr("tcp://a:2")
		})}, status: http.StatusUnprocessableEntity, want: "worker 1: replay_endpoint is supported only for data_parallel_size 1", incomplete: true},

		{name: "block size conflict", reqs: []*WorkerRequest{w(1, nil), w(2, func(r *WorkerRequest) { r.BlockSize = ptr(uint32(32)) })},
			status: http.StatusConflict, want: "worker 2: block_size 32 conflicts with block_size 16 of the other workers of default:default"},
		{name: "eagle conflict", reqs: []*WorkerRequest{w(1, nil), w(2, func(r *WorkerRequest) { r.IsEagle = ptr(true) })},
			status: http.StatusConflict, want: "worker 2: is_eagle true conflicts with is_eagle false of the other workers of default:default"},
		{name: "partition names default", reqs: []*WorkerRequest{
			w(1, func(r *WorkerRequest) { r.ModelName, r.RoutingGroup = ptr(""), ptr("default") }),
			w(2, func(r *WorkerRequest) { r.ModelName, r.BlockSize = ptr("default"), ptr(uint32(32)) }),
		}, status: http.StatusConflict, want: "worker 2: block_size 32 conflicts with block_size 16 of the other workers of default:default"},
		{name: "tenant_id names the group", reqs: []*WorkerRequest{
			w(1, func(r *WorkerRequest) { r.TenantID = ptr("t") }),
			w(2, func(r *WorkerRequest) { r.RoutingGroup, r.BlockSize = ptr("t"), ptr(uint32(32)) }),
		}, status: http.StatusConflict, want: "worker 2: block_size 32 conflicts with block_size 16 of the other workers of default:t"},

		{name: "ranks per worker", cfg: func(c *Config) { c.MaxRanksPerWorker = 2 },
			reqs:   []*WorkerRequest{w(1, func(r *WorkerRequest) { r.DataParallelSize = ptr(uint32(3)) })},
			status: http.StatusUnprocessableEntity, want: "worker 1: data_parallel_size 3 exceeds the bound of 2 ranks per worker (max_ranks_per_worker)"},
		{name: "rank overflow", reqs: []*WorkerRequest{w(1, func(r *WorkerRequest) { r.DataParallelStartRank = ptr(uint32(1<<32 - 1)) })},
			status: http.StatusUnprocessableEntity, want: "worker 1: data_parallel_start_rank 4294967295 + data_parallel_size 1 overflows a u32 rank"},
		{name: "long model name", reqs: []*WorkerRequest{w(1, func(r *WorkerRequest) { r.ModelName = ptr(long) })},
			status: http.StatusUnprocessableEntity, want: "worker 1: model_name is 257 bytes, more than the bound of 256"},
		{name: "long tenant_id", reqs: []*WorkerRequest{w(1, func(r *WorkerRequest) { r.TenantID = ptr(long) })},
			status: http.StatusUnprocessableEntity, want: "worker 1: tenant_id is 257 bytes, more than the bound of 256"},
		{name: "max workers", cfg: func(c *Config) { c.MaxWorkers = 1 }, reqs: []*WorkerRequest{w(1, nil), w(2, nil)},
			status: http.StatusConflict, want: "worker 2: worker catalog is full (1 workers)"},
		{name: "max ranks", cfg: func(c *Config) { c.MaxRanks = 3 }, reqs: []*WorkerRequest{
			w(1, func(r *WorkerRequest) { r.DataParallelSize = ptr(uint32(2)) }),
			w(2, func(r *WorkerRequest) { r.DataParallelSize, r.DataParallelStartRank = ptr(uint32(2)), ptr(uint32(2)) }),
		}, status: http.StatusConflict, want: "worker 2: worker catalog is full: 4 data-parallel ranks with this worker, more than max_ranks 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.UseKVEvents = false
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			err := cfg.CheckWorkers(tc.reqs)
			if tc.status == 0 {
				if err != nil {
					t.Fatalf("got error %v", err)
				}
			} else if err == nil || err.Error() != tc.want || StatusOf(err) != tc.status {
				t.Fatalf("got error %v (status %d), want %q (%d)", err, StatusOf(err), tc.want, tc.status)
			}
			if !cfg.UseKVEvents && !strings.Contains(tc.want, "declared more than once") {
				agreesWithCatalog(t, cfg, tc.reqs, tc.want, tc.incomplete)
			}
		})
	}
}

// agreesWithCatalog upserts reqs into a router built with cfg and checks
// that the catalog gives the error CheckWorkers gave (want, without the
// worker's name; "" for none), or holds the worker as incomplete for that
// reason.
func agreesWithCatalog(t *testing.T, cfg Config, reqs []*WorkerRequest, want string, incomplete bool) {
	t.Helper()
	r, err := NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, reason, _ := strings.Cut(want, ": ")
	for _, req := range reqs {
		rec, err := r.Catalog().UpsertWorker(req)
		switch {
		case err != nil:
			if err.Error() != reason {
				t.Fatalf("the catalog refused %v with %q, CheckWorkers with %q", req, err, want)
			}
			return
		case !rec.Schedulable():
			if !incomplete || rec.NotSchedulableReasons[0] != reason {
				t.Fatalf("the catalog holds worker %d as incomplete (%v), CheckWorkers said %q", rec.WorkerID, rec.NotSchedulableReasons, want)
			}
			return
		}
	}
	if want != "" {
		t.Fatalf("the catalog took every worker, CheckWorkers refused them with %q", want)
	}
}
