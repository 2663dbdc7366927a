package api

// Answers a Dynamo client relies on, each one the gateway once gave
// otherwise (docs/selection-api.md, "Routes" and "Selecting").

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// tokenList is n consecutive token ids from base, as a JSON array.
func tokenList(n int, base int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprint(base + i)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// TestOverlapDescribesTheSelectedWorker: the overlap summary is the
// chosen worker's, each figure the largest over its ranks, and
// longest_matched the largest of gpu, cpu and disk; it was the chosen
// rank's gpu and the best device match of any candidate.
func TestOverlapDescribesTheSelectedWorker(t *testing.T) {
	srv, r := apiServer(t, 0)
	addWorker(t, r, 1, nil)
	addWorker(t, r, 2, func(w *selection.WorkerRequest) {
		w.DataParallelStartRank = ptr(uint32(2))
		w.DataParallelSize = ptr(uint32(2))
	})
	prompt := tokenList(32, 100) // two 16-token blocks
	res := call(t, srv, "POST", "/select_and_reserve", js,
		`{"selection_id":"warm","token_ids":`+prompt+`,"pinned_worker":{"worker_id":2,"dp_rank":2}}`)
	if res.status != 200 {
		t.Fatalf("warm-up booking: %d %s", res.status, res.raw)
	}

	// Worker 2's other rank: the worker holds the prompt on rank 2.
	res = call(t, srv, "POST", "/select", js,
		`{"token_ids":`+prompt+`,"pinned_worker":{"worker_id":2,"dp_rank":3}}`)
	ov := res.body["overlap"].(map[string]any)
	for _, k := range []string{"gpu", "cpu", "disk", "longest_matched"} {
		if ov[k] != float64(32) {
			t.Errorf("pinned (2,3): overlap.%s = %v, want 32, worker 2's best rank: %s", k, ov[k], res.raw)
		}
	}
	if dp := ov["dp"].(map[string]any); dp["2"] != float64(32) || dp["3"] != float64(0) {
		t.Errorf("pinned (2,3): overlap.dp = %v, want each rank's own match", dp)
	}

	// Worker 1 holds nothing: its summary says so, whoever else holds it.
	res = call(t, srv, "POST", "/select", js,
		`{"token_ids":`+prompt+`,"pinned_worker":{"worker_id":1,"dp_rank":0}}`)
	ov = res.body["overlap"].(map[string]any)
	if ov["longest_matched"] != float64(0) || ov["gpu"] != float64(0) {
		t.Errorf("pinned (1,0): overlap %v, want worker 1's (nothing)", ov)
	}
}

// TestAdvisoryPrefillCapacityIsANumber: a worker registered without
// max_num_batched_tokens reports Dynamo's default capacity, never null,
// and its prefill_busy is judged against it.
func TestAdvisoryPrefillCapacityIsANumber(t *testing.T) {
	srv, r := apiServer(t, 0)
	addWorker(t, r, 1, nil) // no max_num_batched_tokens
	res := call(t, srv, "POST", "/select", js, `{"token_ids":[1,2,3],"advisory":true}`)
	wl, _ := res.body["worker_load"].(map[string]any)
	if got := wl["prefill_token_capacity"]; got != float64(selection.DefaultPrefillCapacity) {
		t.Errorf("worker_load.prefill_token_capacity = %#v, want %d: %s", got, selection.DefaultPrefillCapacity, res.raw)
	}
}

// TestPatchKeepsThePartition: a PATCH changes a worker's fields, not its
// model or routing group (Dynamo's patch has neither).
func TestPatchKeepsThePartition(t *testing.T) {
	srv, r := apiServer(t, 0)
	addWorker(t, r, 1, func(w *selection.WorkerRequest) { w.ModelName = ptr("m") })
	res := call(t, srv, "PATCH", "/workers/1", js, `{"model_name":"other","routing_group":"g2","tenant_id":"t","total_kv_blocks":10}`)
	if res.status != 200 {
		t.Fatalf("%d %s", res.status, res.raw)
	}
	if res.body["model_name"] != "m" || res.body["routing_group"] != "default" || res.body["total_kv_blocks"] != float64(10) {
		t.Errorf("PATCH gave %s; want the worker still in m:default, with its new total_kv_blocks", res.raw)
	}
}

// TestReplicaPeersListIsEmpty: without replica sync the peer list is an
// empty array, where the two peer writes are 409s.
func TestReplicaPeersListIsEmpty(t *testing.T) {
	srv, _ := apiServer(t, 0)
	res := call(t, srv, "GET", "/replica_sync/peers", "", "")
	if res.status != 200 || strings.TrimSpace(string(res.raw)) != "[]" {
		t.Errorf("GET /replica_sync/peers = %d %s, want 200 []", res.status, res.raw)
	}
	if res := call(t, srv, "POST", "/replica_sync/register_peer", js, `{"endpoint":"tcp://127.0.0.1:1"}`); res.status != 409 {
		t.Errorf("register_peer = %d, want 409", res.status)
	}
}

// TestHeadOnGetRoutes: each GET route answers HEAD with its status and no
// body; a POST route still refuses it.
func TestHeadOnGetRoutes(t *testing.T) {
	srv, _ := apiServer(t, 0)
	for path, want := range map[string]int{"/health": 200, "/workers": 200, "/loads": 200, "/ready": 503, "/select": 405} {
		req, _ := http.NewRequest("HEAD", srv.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("HEAD %s = %d, want %d", path, resp.StatusCode, want)
		}
	}
}

// TestBookedAnswerAlwaysHasSequenceHashes: a booking names its tracking
// hashes even when the prompt is under one block ([]); an unbooked
// select names none.
func TestBookedAnswerAlwaysHasSequenceHashes(t *testing.T) {
	srv, r := apiServer(t, 0)
	addWorker(t, r, 1, nil)
	res := call(t, srv, "POST", "/select_and_reserve", js, `{"selection_id":"short","token_ids":[1,2,3]}`)
	if res.status != 200 {
		t.Fatalf("%d %s", res.status, res.raw)
	}
	if h, ok := res.body["sequence_hashes"].([]any); !ok || len(h) != 0 {
		t.Errorf("booked answer's sequence_hashes %#v, want []: %s", res.body["sequence_hashes"], res.raw)
	}
	res = call(t, srv, "POST", "/select", js, `{"token_ids":[1,2,3]}`)
	if _, ok := res.body["sequence_hashes"]; ok {
		t.Errorf("an unbooked select names sequence_hashes: %s", res.raw)
	}
}

// TestWorkerRecordShape: a record writes Dynamo's optional fields as null
// when unset, and leaves out the lists and maps Dynamo leaves out when
// empty, so a client indexing the record by name finds what it expects.
func TestWorkerRecordShape(t *testing.T) {
	srv, _ := apiServer(t, 0)
	res := call(t, srv, "POST", "/workers", js, `{"worker_id":1,"endpoint":"127.0.0.1:9","block_size":16}`)
	if res.status != 201 {
		t.Fatalf("%d %s", res.status, res.raw)
	}
	for _, k := range []string{"kv_events_endpoint", "replay_endpoint", "stable_routing_id", "is_eagle",
		"kv_transfer_domain", "kv_transfer_enforcement", "kv_transfer_preferred_weight", "max_num_batched_tokens"} {
		if v, ok := res.body[k]; !ok || v != nil {
			t.Errorf("record member %s: present %v, value %#v; want null", k, ok, v)
		}
	}
	for _, k := range []string{"not_schedulable_reasons", "router_hint_source_control_endpoints", "kv_events_endpoints"} {
		if _, ok := res.body[k]; ok {
			t.Errorf("record member %s present while empty: %s", k, res.raw)
		}
	}
	res = call(t, srv, "POST", "/workers", js, `{"worker_id":2,"block_size":16}`)
	if r, _ := res.body["not_schedulable_reasons"].([]any); len(r) == 0 {
		t.Errorf("an incomplete record names no reasons: %s", res.raw)
	}
}
