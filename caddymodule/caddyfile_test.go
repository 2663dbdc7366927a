package caddymodule

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
)

func TestAppUnmarshalCaddyfile(t *testing.T) {
	for i, tc := range []struct {
		input   string
		want    App
		wantErr string
	}{
		{
			input: `kv_router`,
			want:  App{},
		},
		{
			input: `kv_router {
				block_size 16
				use_kv_events off
			}`,
			want: App{BlockSize: 16, UseKVEvents: ptr(false)},
		},
		{
			input: `kv_router {
				kv_events_bind tcp://*:5557
				kv_events_bind_peers any
				index_max_entries 1000000
			}`,
			want: App{KVEventsBind: "tcp://*:5557", KVEventsBindPeers: "any", IndexMaxEntries: 1000000},
		},
		{
			input: `kv_router {
				use_kv_events on
				overlap_score_credit 0.5
				overlap_score_credit_decay 0.1
				prefill_load_scale 2
				decode_active_request_weight 3
				host_cache_hit_weight 0.7
				disk_cache_hit_weight 0.2
				shared_cache_multiplier 0.5
				router_temperature 0.9
				decode_busy_threshold 0.8
				prefill_busy_threshold 1.5
				assume_kv_reuse false
				track_prefill_tokens off
				track_active_blocks true
				track_output_blocks on
				in_flight_overlap off
				unclipped_overlap_credit on
				approx_ttl 90s
				session_affinity_ttl 10m
				session_affinity_mode soft
				session_table_cap 100
				pending_ttl 1m
				pending_max_entries 10
				pending_max_bytes 1MiB
				reservation_ttl 1d
				max_workers 64
			}`,
			want: App{
				UseKVEvents:               ptr(true),
				OverlapScoreCredit:        ptr(0.5),
				OverlapScoreCreditDecay:   ptr(0.1),
				PrefillLoadScale:          ptr(2.0),
				DecodeActiveRequestWeight: ptr(3.0),
				HostCacheHitWeight:        ptr(0.7),
				DiskCacheHitWeight:        ptr(0.2),
				SharedCacheMultiplier:     ptr(0.5),
				RouterTemperature:         ptr(0.9),
				DecodeBusyThreshold:       ptr(0.8),
				PrefillBusyThreshold:      ptr(1.5),
				AssumeKVReuse:             ptr(false),
				TrackPrefillTokens:        ptr(false),
				TrackActiveBlocks:         ptr(true),
				TrackOutputBlocks:         ptr(true),
				InFlightOverlap:           ptr(false),
				UnclippedOverlapCredit:    ptr(true),
				ApproxTTL:                 caddy.Duration(90 * time.Second),
				SessionAffinityTTL:        caddy.Duration(10 * time.Minute),
				SessionAffinityMode:       "soft",
				SessionTableCap:           100,
				PendingTTL:                caddy.Duration(time.Minute),
				PendingMaxEntries:         10,
				PendingMaxBytes:           1 << 20,
				ReservationTTL:            caddy.Duration(24 * time.Hour),
				MaxWorkers:                64,
			},
		},
		{
			input: `kv_router {
				block_size 16
				worker 1 {
					endpoint 127.0.0.1:8001
					model_name llama
					routing_group blue
					kv_events tcp://127.0.0.1:5557
					replay tcp://127.0.0.1:5558
					block_size 32
					dp_start 2
					dp_size 1
					max_num_batched_tokens 8192
					total_kv_blocks 4096
				}
				worker 0 {
					endpoint 127.0.0.1:8002
				}
			}`,
			want: App{BlockSize: 16, Workers: []WorkerConfig{
				{
					WorkerID: ptr(uint64(1)), Endpoint: "127.0.0.1:8001", ModelName: "llama", RoutingGroup: "blue",
					KVEventsEndpoint: "tcp://127.0.0.1:5557", ReplayEndpoint: "tcp://127.0.0.1:5558",
					BlockSize: 32, DataParallelStartRank: 2, DataParallelSize: 1,
					MaxNumBatchedTokens: 8192, TotalKVBlocks: 4096,
				},
				{WorkerID: ptr(uint64(0)), Endpoint: "127.0.0.1:8002"},
			}},
		},
		{
			input: `kv_router {
				worker_down_after 0
				max_ranks_per_worker 8
				max_ranks 300
				max_reservations_per_worker 100
				max_reservations_per_client 10
				max_reservation_blocks_per_client 4096
				max_dump_events 5000
				index_max_memory 64MiB
				kv_events_max_message 1MiB
				kv_events_max_gap 1000
				kv_events_cores 3
				kv_events_max_peers 64
			}`,
			want: App{WorkerDownAfter: ptr(caddy.Duration(0)), Limits: Limits{
				MaxRanksPerWorker: 8, MaxRanks: 300, MaxReservationsPerWorker: 100, MaxReservationsPerClient: 10,
				MaxReservationBlocksPerClient: 4096, MaxDumpEvents: 5000, IndexMaxMemory: 64 << 20, KVEventsMaxMessage: 1 << 20, KVEventsMaxGap: 1000,
				KVEventsCores: 3, KVEventsMaxPeers: 64,
			}},
		},
		{input: "kv_router {\n max_ranks -1\n}", wantErr: "max_ranks must be a non-negative integer"},
		{input: "kv_router {\n index_max_memory lots\n}", wantErr: "parsing index_max_memory"},
		{input: "kv_router {\n kv_events_max_gap -5\n}", wantErr: "kv_events_max_gap must be an unsigned 64-bit integer"},
		{input: "kv_router {\n kv_events_cores -1\n}", wantErr: "kv_events_cores must be a non-negative integer"},
		{input: "kv_router {\n kv_events_max_peers -1\n}", wantErr: "kv_events_max_peers must be a non-negative integer"},
		{input: `kv_router extra`, wantErr: "wrong argument count"},
		{input: "kv_router {\n bogus 1\n}", wantErr: "unrecognized subdirective bogus"},
		{input: "kv_router {\n block_size\n}", wantErr: "wrong argument count"},
		{input: "kv_router {\n block_size 16 32\n}", wantErr: "wrong argument count"},
		{input: "kv_router {\n block_size -1\n}", wantErr: "block_size must be an unsigned 32-bit integer"},
		{input: "kv_router {\n block_size 4294967296\n}", wantErr: "block_size must be an unsigned 32-bit integer"},
		{input: "kv_router {\n use_kv_events maybe\n}", wantErr: `use_kv_events must be on or off, not "maybe"`},
		{input: "kv_router {\n router_temperature -1\n}", wantErr: "router_temperature must be a finite non-negative number"},
		{input: "kv_router {\n prefill_load_scale NaN\n}", wantErr: "prefill_load_scale must be a finite non-negative number"},
		{input: "kv_router {\n pending_ttl soon\n}", wantErr: "parsing pending_ttl"},
		{input: "kv_router {\n reservation_ttl -5s\n}", wantErr: "reservation_ttl must not be negative"},
		{input: "kv_router {\n session_affinity_mode sticky\n}", wantErr: "session_affinity_mode must be hard or soft"},
		{input: "kv_router {\n max_workers -3\n}", wantErr: "max_workers must be a non-negative integer"},
		{input: "kv_router {\n index_max_entries 1.5\n}", wantErr: "index_max_entries must be a whole number"},
		{input: "kv_router {\n kv_events_bind\n}", wantErr: "wrong argument count"},
		{input: "kv_router {\n kv_events_bind_peers\n}", wantErr: "wrong argument count"},
		{input: "kv_router {\n pending_max_bytes lots\n}", wantErr: "parsing pending_max_bytes"},
		{input: "kv_router {\n worker {\n endpoint a:1\n }\n}", wantErr: "wrong argument count"},
		{input: "kv_router {\n worker x {\n endpoint a:1\n }\n}", wantErr: `worker id "x" must be an unsigned integer`},
		{input: "kv_router {\n worker 1 2 {\n endpoint a:1\n }\n}", wantErr: "wrong argument count"},
		{input: "kv_router {\n worker 1 {\n endpoint\n }\n}", wantErr: "wrong argument count"},
		{input: "kv_router {\n worker 1 {\n dp_size two\n }\n}", wantErr: "dp_size must be an unsigned 32-bit integer"},
		{input: "kv_router {\n worker 1 {\n weight 3\n }\n}", wantErr: "unrecognized worker subdirective weight"},
	} {
		var got App
		err := got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
		if !parsedAsWanted(t, i, err, tc.wantErr) {
			continue
		}
		if g, w := mustJSON(t, got), mustJSON(t, tc.want); g != w {
			t.Errorf("Test %d: got\n%s\nwant\n%s", i, g, w)
		}
	}
}

func TestParseGlobalOption(t *testing.T) {
	val, err := parseGlobalOption(caddyfile.NewTestDispenser("kv_router {\n block_size 16\n}"), nil)
	if err != nil {
		t.Fatal(err)
	}
	app, ok := val.(httpcaddyfile.App)
	if !ok {
		t.Fatalf("got %T, want httpcaddyfile.App", val)
	}
	if app.Name != "kv_router" || string(app.Value) != `{"block_size":16}` {
		t.Errorf("got %s = %s", app.Name, app.Value)
	}

	_, err = parseGlobalOption(caddyfile.NewTestDispenser("kv_router {\n block_size 16\n}"), app)
	if err == nil || !strings.Contains(err.Error(), "only once") {
		t.Errorf("second kv_router block: got error %v, want one saying it may be given only once", err)
	}
}

func TestSelectionHandlerUnmarshalCaddyfile(t *testing.T) {
	for i, tc := range []struct {
		input   string
		want    int64
		token   string
		wantErr string
	}{
		{input: `kv_selection`, want: 0},
		{input: "kv_selection {\n max_body_size 8MiB\n}", want: 8 << 20},
		{input: "kv_selection {\n max_body_size 64\n}", want: 64},
		{input: "kv_selection {\n max_body_size 1KB\n}", want: 1000},
		{input: `kv_selection extra`, wantErr: "wrong argument count"},
		{input: "kv_selection {\n max_body_size\n}", wantErr: "wrong argument count"},
		{input: "kv_selection {\n max_body_size huge\n}", wantErr: "parsing max_body_size"},
		{input: "kv_selection {\n max_body_size 0\n}", wantErr: "out of range"},
		{input: "kv_selection {\n timeout 5s\n}", wantErr: "unrecognized subdirective timeout"},
		{input: "kv_selection {\n write_token {env.TOKEN}\n}", token: "{env.TOKEN}"},
		{input: "kv_selection {\n write_token\n}", wantErr: "wrong argument count"},
	} {
		var h SelectionHandler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
		if !parsedAsWanted(t, i, err, tc.wantErr) {
			continue
		}
		if h.MaxBodySize != tc.want || h.WriteToken != tc.token {
			t.Errorf("Test %d: max_body_size = %d, write_token %q, want %d and %q", i, h.MaxBodySize, h.WriteToken, tc.want, tc.token)
		}
	}
}

// parsedAsWanted checks table case i's parse error against wantErr (empty:
// no error) and tells whether the case parsed, so that its result is to
// be compared.
func parsedAsWanted(t *testing.T, i int, err error, wantErr string) bool {
	t.Helper()
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("Test %d: got error %v, want one containing %q", i, err, wantErr)
		}
		return false
	}
	if err != nil {
		t.Errorf("Test %d: unexpected error: %v", i, err)
		return false
	}
	return true
}
