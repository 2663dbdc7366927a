package caddymodule

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

func TestAppBuildDefaults(t *testing.T) {
	var a App
	cfg, workers, err := a.build()
	if err != nil {
		t.Fatal(err)
	}
	want := selection.GatewayConfig()
	if n := ranksForDescriptors(); n > 0 && n < want.MaxRanks {
		want.MaxRanks = n // this machine's descriptor limit bounds it further
	}
	if changed := changedSettings(want, cfg); len(changed) > 0 || cfg.WorkerDownAfter != 30*time.Second {
		t.Errorf("an empty app differs from the gateway's defaults in %v (worker_down_after %v)", changed, cfg.WorkerDownAfter)
	}
	if len(workers) != 0 {
		t.Errorf("got %d workers, want none", len(workers))
	}
}

func TestAppBuildSettings(t *testing.T) {
	a := App{
		BlockSize:                 16,
		UseKVEvents:               ptr(false),
		OverlapScoreCredit:        ptr(0.5),
		OverlapScoreCreditDecay:   ptr(0.1),
		PrefillLoadScale:          ptr(2.0),
		DecodeActiveRequestWeight: ptr(3.0),
		HostCacheHitWeight:        ptr(0.7),
		DiskCacheHitWeight:        ptr(0.2),
		SharedCacheMultiplier:     ptr(0.4),
		RouterTemperature:         ptr(0.9),
		DecodeBusyThreshold:       ptr(0.8),
		PrefillBusyThreshold:      ptr(1.5),
		AssumeKVReuse:             ptr(false),
		TrackPrefillTokens:        ptr(false),
		TrackActiveBlocks:         ptr(false),
		TrackOutputBlocks:         ptr(true),
		InFlightOverlap:           ptr(false),
		UnclippedOverlapCredit:    ptr(false),
		ApproxTTL:                 caddy.Duration(90 * time.Second),
		SessionAffinityTTL:        caddy.Duration(10 * time.Minute),
		SessionAffinityMode:       "soft",
		SessionTableCap:           100,
		PendingTTL:                caddy.Duration(time.Minute),
		PendingMaxEntries:         10,
		PendingMaxBytes:           1 << 20,
		ReservationTTL:            caddy.Duration(time.Hour),
		WorkerDownAfter:           ptr(caddy.Duration(5 * time.Second)),
		MaxWorkers:                64,
		Limits: Limits{MaxRanksPerWorker: 8, MaxRanks: 300, MaxReservationsPerWorker: 100,
			MaxReservationsPerClient: 10, MaxReservationBlocksPerClient: 4096, MaxDumpEvents: 5000},
	}
	cfg, _, err := a.build()
	if err != nil {
		t.Fatal(err)
	}
	want := selection.Config{
		OverlapScoreCredit:            0.5,
		OverlapScoreCreditDecay:       0.1,
		PrefillLoadScale:              2,
		DecodeActiveRequestWeight:     3,
		HostCacheHitWeight:            0.7,
		DiskCacheHitWeight:            0.2,
		SharedCacheMultiplier:         0.4,
		RouterTemperature:             0.9,
		TrackOutputBlocks:             true,
		ApproxTTL:                     90 * time.Second,
		DecodeBusyThreshold:           ptr(0.8),
		PrefillBusyThreshold:          ptr(1.5),
		PendingTTL:                    time.Minute,
		PendingMaxEntries:             10,
		PendingMaxBytes:               1 << 20,
		SessionAffinityTTL:            10 * time.Minute,
		SessionAffinitySoft:           true,
		SessionTableCap:               100,
		ReservationTTL:                time.Hour,
		WorkerDownAfter:               5 * time.Second,
		DefaultBlockSize:              16,
		MaxWorkers:                    64,
		MaxRanksPerWorker:             8,
		MaxRanks:                      300,
		MaxReservationsPerRank:        100,
		MaxReservationsPerClient:      10,
		MaxReservationBlocksPerClient: 4096,
		MaxDumpEvents:                 5000,
	}
	if changed := changedSettings(want, cfg); len(changed) > 0 {
		t.Errorf("settings not carried over: %v", changed)
	}
	// worker_down_after 0 turns dead-worker detection off.
	cfg, _, _ = (&App{WorkerDownAfter: ptr(caddy.Duration(0))}).build()
	if cfg.WorkerDownAfter != 0 {
		t.Errorf("worker_down_after 0 left %v", cfg.WorkerDownAfter)
	}
}

func TestRanksForDescriptors(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skip(err)
	}
	n := ranksForDescriptors()
	if n <= 0 || uint64(n*descriptorsPerRank) > lim.Cur-min(lim.Cur/2, reservedDescriptors) {
		t.Fatalf("%d ranks for a limit of %d descriptors", n, lim.Cur)
	}
}

func TestAppBuildErrors(t *testing.T) {
	w := func(id uint64, endpoint string) WorkerConfig {
		return WorkerConfig{WorkerID: &id, Endpoint: endpoint}
	}
	for i, tc := range []struct {
		app     App
		wantErr string
	}{
		{App{UseKVEvents: ptr(false), KVEventsBind: "tcp://*:5557"}, "kv_events_bind needs use_kv_events on"},
		{App{KVEventsBind: "http://x"}, "is not a tcp://, ipc:// or inproc:// endpoint"},
		{App{KVEventsBind: "tcp://*:5557", KVEventsBindPeers: "nobody"}, `kv_events_bind_peers "nobody": worker_host or any`},
		{App{KVEventsBindPeers: "any"}, "kv_events_bind_peers needs kv_events_bind"},
		{App{RouterTemperature: ptr(-1.0)}, "router_temperature must be finite and non-negative"},
		{App{DecodeBusyThreshold: ptr(-0.5)}, "decode_busy_threshold must be finite and non-negative"},
		{App{SessionAffinityTTL: caddy.Duration(time.Millisecond)}, "session affinity ttl must be between"},
		{App{SessionAffinityMode: "sticky"}, "session_affinity_mode must be hard or soft"},
		{App{PendingTTL: -1}, "pending_ttl must not be negative"},
		{App{MaxWorkers: -1}, "max_workers must not be negative"},
		{App{Limits: Limits{KVEventsMaxMessage: 10}}, "kv_events_max_message 10 is below 4096 bytes"},
		{App{Limits: Limits{IndexMaxMemory: 1000}}, "index_max_memory 1000 is below 16777216 bytes"},
		{App{BlockSize: 16, Workers: []WorkerConfig{{Endpoint: "a:1"}}}, "workers[0]: worker_id is required"},
		{App{BlockSize: 16, Workers: []WorkerConfig{w(1, "a:1"), w(1, "b:1")}}, "worker 1: declared more than once"},
		{App{BlockSize: 16, Workers: []WorkerConfig{w(1, "")}}, "worker 1: endpoint is required"},
		{App{Workers: []WorkerConfig{w(1, "a:1")}}, "worker 1: block_size is required"},
		{App{BlockSize: 16, Workers: []WorkerConfig{
			{WorkerID: ptr(uint64(1)), Endpoint: "a:1", ReplayEndpoint: "tcp://a:2", DataParallelSize: 2},
		}}, "worker 1: replay_endpoint is supported only for data_parallel_size 1"},
		{App{BlockSize: 16, Workers: []WorkerConfig{
			w(1, "a:1"),
			{WorkerID: ptr(uint64(2)), Endpoint: "b:1", BlockSize: 32},
		}}, "worker 2: block_size 32 conflicts with block_size 16 of the other workers of default:default"},
		// The catalog's bounds, checked before the shared router changes.
		{App{BlockSize: 16, Limits: Limits{MaxRanksPerWorker: 2}, Workers: []WorkerConfig{
			{WorkerID: ptr(uint64(3)), Endpoint: "a:1", DataParallelSize: 4},
		}}, "worker 3: data_parallel_size 4 exceeds the bound of 2 ranks per worker"},
		{App{BlockSize: 16, MaxWorkers: 1, Workers: []WorkerConfig{w(1, "a:1"), w(2, "b:1")}}, "worker 2: worker catalog is full (1 workers)"},
	} {
		_, _, err := tc.app.build()
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("Test %d: got error %v, want one containing %q", i, err, tc.wantErr)
		}
		if verr := tc.app.Validate(); (verr == nil) != (err == nil) {
			t.Errorf("Test %d: Validate and build disagree: %v vs %v", i, verr, err)
		}
	}
}

func TestWorkerRequest(t *testing.T) {
	a := App{BlockSize: 16, Workers: []WorkerConfig{
		{WorkerID: ptr(uint64(7)), Endpoint: "a:1"},
		{
			WorkerID: ptr(uint64(8)), Endpoint: "b:1", ModelName: "m", RoutingGroup: "g",
			KVEventsEndpoint: "tcp://b:2", ReplayEndpoint: "tcp://b:3", BlockSize: 32,
			DataParallelStartRank: 4, MaxNumBatchedTokens: 8192, TotalKVBlocks: 1000,
		},
	}}
	_, reqs, err := a.build()
	if err != nil {
		t.Fatal(err)
	}
	got := mustJSON(t, reqs)
	want := `[{"worker_id":7,"endpoint":"a:1","block_size":16,"data_parallel_start_rank":0,"data_parallel_size":1},` +
		`{"worker_id":8,"model_name":"m","routing_group":"g","endpoint":"b:1","kv_events_endpoint":"tcp://b:2",` +
		`"replay_endpoint":"tcp://b:3","block_size":32,"data_parallel_start_rank":4,"data_parallel_size":1,` +
		`"max_num_batched_tokens":8192,"total_kv_blocks":1000}]`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestSyncWorkers(t *testing.T) {
	cfg := selection.DefaultConfig()
	cfg.UseKVEvents = false
	r, err := selection.NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &routerState{router: r, fromConfig: map[uint64]struct{}{}}
	defer func() { _ = s.Destruct() }()
	log := zap.NewNop()

	workers := func(ids ...uint64) []*selection.WorkerRequest {
		a := App{BlockSize: 16}
		for _, id := range ids {
			a.Workers = append(a.Workers, WorkerConfig{WorkerID: ptr(id), Endpoint: "127.0.0.1:1"})
		}
		_, reqs, err := a.build()
		if err != nil {
			t.Fatal(err)
		}
		return reqs
	}
	ids := func() []uint64 {
		var out []uint64
		for _, w := range r.Catalog().ListWorkers("", "") {
			out = append(out, w.WorkerID)
		}
		return out
	}

	if gen, err := s.syncWorkers(workers(1, 2), log); err != nil || gen != 1 {
		t.Fatalf("first sync: generation %d, error %v", gen, err)
	}
	// A worker registered through the API is not the config's to delete.
	if _, err := r.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: ptr(uint64(9)), Endpoint: ptr("127.0.0.1:9"), BlockSize: ptr(uint32(16))}); err != nil {
		t.Fatal(err)
	}
	if gen, err := s.syncWorkers(workers(2, 3), log); err != nil || gen != 2 {
		t.Fatalf("second sync: generation %d, error %v", gen, err)
	}
	if got, want := ids(), []uint64{2, 3, 9}; !slices.Equal(got, want) {
		t.Errorf("after dropping worker 1: workers %v, want %v", got, want)
	}

	// A rejected upsert keeps the previous config's workers, and remembers
	// the ones applied before it so that a later config can remove them.
	bad := workers(4)
	bad = append(bad, &selection.WorkerRequest{WorkerID: ptr(uint64(5)), Endpoint: ptr("127.0.0.1:5"), BlockSize: ptr(uint32(32))})
	if _, err := s.syncWorkers(bad, log); err == nil || !strings.Contains(err.Error(), "worker 5:") {
		t.Fatalf("conflicting block size: got error %v", err)
	}
	if got, want := ids(), []uint64{2, 3, 4, 9}; !slices.Equal(got, want) {
		t.Errorf("after a rejected sync: workers %v, want %v", got, want)
	}
	if _, err := s.syncWorkers(workers(2), log); err != nil {
		t.Fatal(err)
	}
	if got, want := ids(), []uint64{2, 9}; !slices.Equal(got, want) {
		t.Errorf("after recovering: workers %v, want %v", got, want)
	}
}

func TestChangedSettings(t *testing.T) {
	a := selection.DefaultConfig()
	b := a
	if got := changedSettings(a, b); len(got) != 0 {
		t.Errorf("equal configs: got %v", got)
	}
	b.ApproxTTL = time.Minute
	b.UseKVEvents = !a.UseKVEvents
	b.DecodeBusyThreshold = ptr(0.5)
	b.DefaultBlockSize = 32
	// Sorted, so that reordering selection.Config does not break the test.
	if got, want := sorted(changedSettings(a, b)), []string{"approx_ttl", "block_size", "decode_busy_threshold", "use_kv_events"}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	// Equal values behind different pointers are no change.
	a.DecodeBusyThreshold = ptr(0.5)
	if got, want := sorted(changedSettings(a, b)), []string{"approx_ttl", "block_size", "use_kv_events"}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func sorted(s []string) []string {
	slices.Sort(s)
	return s
}

func TestSnakeCase(t *testing.T) {
	for in, want := range map[string]string{
		"ApproxTTL":                 "approx_ttl",
		"UseKVEvents":               "use_kv_events",
		"DecodeActiveRequestWeight": "decode_active_request_weight",
		"MaxWorkers":                "max_workers",
		"ID":                        "id",
	} {
		if got := snakeCase(in); got != want {
			t.Errorf("snakeCase(%q) = %q, want %q", in, got, want)
		}
	}
}

// A failed Provision must leave the pool alone, and its Cleanup must not
// release a reference it never took.
func TestProvisionFailureLeavesPoolAlone(t *testing.T) {
	before, _ := routers.References(routerKey)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	a := &App{KVEventsBind: "not-an-endpoint"}
	if err := a.Provision(ctx); err == nil {
		t.Fatal("provisioning with a bad kv_events_bind succeeded")
	}
	if a.Router() != nil {
		t.Error("failed provision left a router")
	}
	if err := a.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if after, _ := routers.References(routerKey); after != before {
		t.Errorf("pool references went from %d to %d", before, after)
	}
}

func ptr[T any](v T) *T { return &v }

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
