package api

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestAPIReservationBounds: the handler counts bookings per remote IP, and
// a client past its bound gets a 429 with Dynamo's error body.
func TestAPIReservationBounds(t *testing.T) {
	r := newTestRouter(t, func(c *selection.Config) { c.MaxReservationsPerClient = 2 })
	srv := httptest.NewServer(NewHandler(r, 0))
	t.Cleanup(srv.Close)
	addWorker(t, r, 1, nil)
	for i, tc := range []struct {
		path, body string
		status     int
	}{
		{"/select_and_reserve", `{"token_ids":[1,2,3]}`, 200},
		{"/reservations", `{"selection_id":"e1","worker_id":1,"sequence_hashes":[1],"isl_tokens":16}`, 201},
		{"/select_and_reserve", `{"token_ids":[1,2,3]}`, 429},
		{"/reservations", `{"selection_id":"e2","worker_id":1,"sequence_hashes":[1],"isl_tokens":16}`, 429},
	} {
		res := call(t, srv, "POST", tc.path, js, tc.body)
		if res.status != tc.status {
			t.Fatalf("%d: %s: %d %s", i, tc.path, res.status, res.raw)
		}
		if msg, _ := res.body["error"].(string); tc.status == 429 && !strings.Contains(msg, "client 127.0.0.1 holds 2 reservations") {
			t.Fatalf("%d: error %q", i, msg)
		}
	}
	if res := call(t, srv, "DELETE", "/reservations/e1", "", ""); res.status != 200 {
		t.Fatalf("free: %d %s", res.status, res.raw)
	}
	if res := call(t, srv, "POST", "/select_and_reserve", js, `{"token_ids":[1,2,3]}`); res.status != 200 {
		t.Fatalf("after a free: %d %s", res.status, res.raw)
	}
}

// TestAPIRegistrationBounds: over HTTP the refusals are 422 and 409 with
// Dynamo's error body, and the process survives a 2^32-1 rank worker.
func TestAPIRegistrationBounds(t *testing.T) {
	srv, _ := apiServer(t, 0)
	for _, tc := range []struct {
		body   string
		status int
		errSub string
	}{
		{`{"worker_id":1,"endpoint":"127.0.0.1:8001","block_size":16,"data_parallel_size":4294967295}`, 422, "max_ranks_per_worker"},
		{`{"worker_id":1,"endpoint":"127.0.0.1:8001","block_size":16,"data_parallel_size":1000000}`, 422, "max_ranks_per_worker"},
		{`{"worker_id":1,"endpoint":"127.0.0.1:8001","block_size":16,"model_name":"` + strings.Repeat("m", 300) + `"}`, 422, "model_name is 300 bytes"},
		{`{"worker_id":1,"endpoint":"127.0.0.1:8001","block_size":16}`, 201, ""},
	} {
		res := call(t, srv, "POST", "/workers", js, tc.body)
		if msg, _ := res.body["error"].(string); res.status != tc.status || !strings.Contains(msg, tc.errSub) {
			t.Errorf("%.80s: %d %s, want %d with %q", tc.body, res.status, res.raw, tc.status, tc.errSub)
		}
	}
	res := call(t, srv, "PATCH", "/workers/1", js, `{"data_parallel_size":4294967295}`)
	if res.status != 422 {
		t.Fatalf("patch: %d %s", res.status, res.raw)
	}
}

// TestAPIISLTokensBound: a hash-path request's isl_tokens is at most 2^24;
// past it, a 400, so no booking can wrap its rank's prefill load (one of
// 2^64 - 50,000 tokens took another's 50,000 back to 0).
func TestAPIISLTokensBound(t *testing.T) {
	srv, r := apiServer(t, 0)
	addWorker(t, r, 1, nil)
	book := func(id, isl string) apiResult {
		return call(t, srv, "POST", "/reservations", js, `{"selection_id":"`+id+`","worker_id":1,"sequence_hashes":[1],"isl_tokens":`+isl+`}`)
	}
	if res := book("a", "50000"); res.status != 201 {
		t.Fatalf("a booking of 50,000 tokens: %d %s", res.status, res.raw)
	}
	for _, isl := range []string{"18446744073709501616", "16777217"} {
		if res := book("b"+isl, isl); res.status != 400 || !strings.Contains(res.raw, "isl_tokens must be at most 16777216") {
			t.Errorf("isl_tokens %s: %d %s, want 400", isl, res.status, res.raw)
		}
		if res := call(t, srv, "POST", "/select", js, `{"sequence_hashes":[1],"block_hashes":[1],"isl_tokens":`+isl+`}`); res.status != 400 {
			t.Errorf("/select with isl_tokens %s: %d %s, want 400", isl, res.status, res.raw)
		}
	}
	if res := book("c", "16777216"); res.status != 201 {
		t.Fatalf("a booking at the bound: %d %s", res.status, res.raw)
	}
	loads := call(t, srv, "GET", "/loads", "", "")
	if !strings.Contains(loads.raw, `"potential_prefill_tokens":16827216`) {
		t.Fatalf("loads after bookings of 50,000 and 16,777,216 tokens: %s", loads.raw)
	}
}
