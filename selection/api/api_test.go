package api

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// apiServer serves a fresh router over real HTTP on 127.0.0.1.
func apiServer(t *testing.T, maxBody int64) (*httptest.Server, *selection.Router) {
	t.Helper()
	r := newTestRouter(t, nil)
	srv := httptest.NewServer(NewHandler(r, maxBody))
	t.Cleanup(srv.Close)
	return srv, r
}

type apiResult struct {
	status int
	body   map[string]any
	raw    string
}

func call(t *testing.T, srv *httptest.Server, method, path, ctype, body string) apiResult {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	res := apiResult{status: resp.StatusCode, raw: string(raw)}
	_ = json.Unmarshal(raw, &res.body)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s %s: content type %q", method, path, ct)
	}
	return res
}

const js = "application/json"

func TestAPIStatusesAndErrors(t *testing.T) {
	srv, _ := apiServer(t, 1024)
	tests := []struct {
		method, path, ctype, body string
		status                    int
		errSub                    string
	}{
		{"GET", "/nope", "", "", 404, "route not found"},
		{"GET", "/select", "", "", 405, "method not allowed"},
		{"PUT", "/workers", js, "{}", 405, "method not allowed"},
		{"POST", "/select", "", `{"token_ids":[1]}`, 415, "Expected request with `Content-Type: application/json`"},
		{"POST", "/select", "text/plain", `{"token_ids":[1]}`, 415, "Content-Type"},
		{"POST", "/select", js, `{"token_ids":[1,`, 400, "Failed to parse the request body as JSON"},
		{"POST", "/select", js, `{"token_ids":[1,-1]}`, 422, "token_ids[1]"},
		{"POST", "/select", js, `{"is_eagle":"false","token_ids":[1]}`, 422, "Failed to deserialize the JSON body"},
		{"POST", "/select", js, `{"token_ids":[` + strings.Repeat("1,", 600) + `1]}`, 413, "length limit exceeded"},
		{"POST", "/select", "application/vnd.x+json", `{"token_ids":[1]}`, 503, "no schedulable workers for default:default"},
		{"POST", "/reservations", js, `{}`, 422, "missing field `selection_id`"},
		{"POST", "/select", js, `{"token_ids":[1],"routing_group":"` + strings.Repeat("g", 257) + `"}`, 400, "routing_group must be at most 256 bytes"},
		{"POST", "/select", js, `{"token_ids":[1],"model_name":"` + strings.Repeat("m", 257) + `"}`, 400, "model_name must be at most 256 bytes"},
		{"POST", "/reservations", js, `{"selection_id":"q","model_name":"` + strings.Repeat("m", 257) + `"}`, 400, "model_name must be at most 256 bytes"},
		{"POST", "/reservations", js, `{"selection_id":"q"}`, 404, "no pending selection q"},
		{"POST", "/workers", js, `{"endpoint":"x"}`, 422, "missing field `worker_id`"},
		{"POST", "/workers", js, `{"worker_id":-1}`, 422, ""},
		{"PATCH", "/workers/abc", js, `{}`, 400, "Cannot parse"},
		{"DELETE", "/workers/5", "", "", 404, "worker 5 not found"},
		{"DELETE", "/reservations/zz", "", "", 404, "reservation zz not found"},
		{"POST", "/reservations/zz/prefill_complete", "", "", 404, "reservation zz not found"},
		{"POST", "/reservations/zz/output_block", js, `{"decay_fraction":1.5}`, 400, "decay_fraction must be between 0.0 and 1.0"},
		{"GET", "/ready", "", "", 503, ""},
		{"GET", "/health", "", "", 200, ""},
		{"POST", "/replica_sync/register_peer", js, `{"endpoint":"tcp://127.0.0.1:1"}`, 409, "replica sync is disabled"},
		{"GET", "/replica_sync/peers", "", "", 200, ""}, // [] (TestReplicaPeersListIsEmpty)
		{"GET", "/replica_sync/register_peer", "", "", 405, "method not allowed"},
	}
	for i, tc := range tests {
		res := call(t, srv, tc.method, tc.path, tc.ctype, tc.body)
		if res.status != tc.status {
			t.Errorf("Test %d: %s %s: status %d (%s), want %d", i, tc.method, tc.path, res.status, res.raw, tc.status)
			continue
		}
		if tc.errSub != "" {
			msg, _ := res.body["error"].(string)
			if !strings.Contains(msg, tc.errSub) {
				t.Errorf("Test %d: error %q, want it to contain %q", i, msg, tc.errSub)
			}
		}
	}
}

func TestAPIFlow(t *testing.T) {
	srv, _ := apiServer(t, 0)
	res := call(t, srv, "POST", "/workers", js, `{"worker_id":1,"endpoint":"127.0.0.1:8001","block_size":4}`)
	if res.status != 201 || res.body["lifecycle"] != "schedulable" {
		t.Fatalf("upsert: %d %s", res.status, res.raw)
	}
	res = call(t, srv, "POST", "/workers", js, `{"worker_id":2,"block_size":4}`)
	if res.status != 201 || res.body["lifecycle"] != "incomplete" {
		t.Fatalf("incomplete upsert: %d %s", res.status, res.raw)
	}
	res = call(t, srv, "GET", "/workers?model_name=default", "", "")
	var list []map[string]any
	_ = json.Unmarshal([]byte(res.raw), &list)
	if res.status != 200 || len(list) != 2 {
		t.Fatalf("list: %s", res.raw)
	}
	res = call(t, srv, "GET", "/ready", "", "")
	if res.status != 200 || res.body["schedulable_workers"] != 1.0 {
		t.Fatalf("ready: %s", res.raw)
	}
	res = call(t, srv, "POST", "/select", js, `{"selection_id":"s1","token_ids":[1,2,3,4,5]}`)
	if res.status != 200 || res.body["endpoint"] != "127.0.0.1:8001" || res.body["effective_prefill_tokens"] != 5.0 {
		t.Fatalf("select: %s", res.raw)
	}
	for _, gone := range []string{"cached_tokens", "effective_overlap_blocks", "tenant_id", "reservation_id", "sequence_hashes"} {
		if _, ok := res.body[gone]; ok {
			t.Fatalf("select response carries %s: %s", gone, res.raw)
		}
	}
	res = call(t, srv, "POST", "/reservations", js, `{"selection_id":"s1"}`)
	if res.status != 201 || res.body["worker_id"] != 1.0 {
		t.Fatalf("cached reservation: %d %s", res.status, res.raw)
	}
	res = call(t, srv, "POST", "/select_and_reserve", js, `{"selection_id":"s2","block_hashes":[-5],"sequence_hashes":[-5],"isl_tokens":4}`)
	if res.status != 200 || !strings.Contains(res.raw, `"sequence_hashes":[-5]`) || res.body["isl_tokens"] != 4.0 {
		t.Fatalf("select_and_reserve: %s", res.raw)
	}
	res = call(t, srv, "POST", "/select_and_reserve", js, `{"selection_id":"s2","token_ids":[1]}`)
	if res.status != 409 {
		t.Fatalf("duplicate: %d", res.status)
	}
	res = call(t, srv, "GET", "/loads", "", "")
	if !strings.Contains(res.raw, `"active_requests":2`) {
		t.Fatalf("loads: %s", res.raw)
	}
	for _, c := range []struct{ method, path, ctype, body string }{
		{"POST", "/reservations/s1/prefill_complete", "", ""},
		{"POST", "/reservations/s1/output_block", "", ""},
		{"POST", "/reservations/s1/output_block", js, `{"decay_fraction":0.5}`},
		{"DELETE", "/reservations/s1", "", ""},
		{"DELETE", "/reservations/s2", "", ""},
	} {
		if res := call(t, srv, c.method, c.path, c.ctype, c.body); res.status != 200 || res.body["status"] != "ok" {
			t.Fatalf("%s %s: %d %s", c.method, c.path, res.status, res.raw)
		}
	}
	res = call(t, srv, "POST", "/potential_loads", js, `{"token_ids":[1,2,3,4]}`)
	if res.status != 200 || !strings.Contains(res.raw, `"potential_decode_blocks":1`) {
		t.Fatalf("potential loads: %s", res.raw)
	}
	res = call(t, srv, "POST", "/overlap_scores", js, `{"token_ids":[1,2,3,4]}`)
	if res.status != 200 || !strings.Contains(res.raw, `"shared_beyond_device_blocks":null`) || res.body["num_blocks"] != 1.0 {
		t.Fatalf("overlap scores: %s", res.raw)
	}
	res = call(t, srv, "GET", "/dump", "", "")
	if res.status != 200 || !strings.Contains(res.raw, `"default:default":{"block_size":4,"events":[{"worker_id":1`) {
		t.Fatalf("dump: %s", res.raw)
	}
	res = call(t, srv, "PATCH", "/workers/1", js, `{"total_kv_blocks":10}`)
	if res.status != 200 || res.body["total_kv_blocks"] != 10.0 || res.body["endpoint"] != "127.0.0.1:8001" {
		t.Fatalf("patch: %s", res.raw)
	}
	res = call(t, srv, "DELETE", "/workers/1", "", "")
	if res.status != 200 || res.body["lifecycle"] != "unschedulable" {
		t.Fatalf("delete: %s", res.raw)
	}
}
