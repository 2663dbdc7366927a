package caddymodule

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// The integration tests share one Caddy that runs inside the test binary,
// so they must not run in parallel. Its admin, HTTP and HTTPS ports are
// loopback ports the OS picks once per test process, so two runs on one
// machine (two engineers, a CI shard and a developer) neither collide nor
// load their configs into each other's Caddy. testcaddy_test.go starts it.
var testAdminPort, testHTTPPort, testHTTPSPort = freeLoopbackPorts()

// freeLoopbackPorts asks the OS for three distinct free ports on
// 127.0.0.1: it listens on port 0 three times at once, reads the ports and
// closes the listeners. The first test binds the admin and HTTP ports
// before it starts anything else that could take them (newTester), and
// Caddy then holds both until the process exits (reloads keep its
// listeners); the HTTPS port is never bound, auto_https being off.
func freeLoopbackPorts() (admin, site, tls int) {
	var ports [3]int
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			panic(fmt.Sprintf("no free loopback port for the integration tests: %v", err))
		}
		defer ln.Close()
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports[0], ports[1], ports[2]
}

var apiBase = fmt.Sprintf("http://127.0.0.1:%d", testHTTPPort)

// testGlobals are the global options every test config starts with: the
// test ports, loopback admin, a short grace period, no TLS.
var testGlobals = fmt.Sprintf(`	admin localhost:%d
	http_port %d
	https_port %d
	grace_period 1s
	skip_install_trust
	auto_https off
`, testAdminPort, testHTTPPort, testHTTPSPort)

// testCaddyfile serves the selection API on the test port, with a second
// copy under /small/ that accepts bodies of at most 64 bytes. The workers
// block goes into the kv_router global option.
func testCaddyfile(workers string) string {
	return approxCaddyfile(workers, `	handle_path /small/* {
		kv_selection {
			max_body_size 64
		}
	}
	handle {
		kv_selection
	}`)
}

// approxCaddyfile is a config in approximate mode (no KV events) with the
// workers block in the kv_router global option and site as the body of
// the site on the test port.
func approxCaddyfile(workers, site string) string {
	return fmt.Sprintf(`{
%s	kv_router {
		block_size 4
		use_kv_events off
%s
	}
}

:%d {
	bind 127.0.0.1
%s
}
`, testGlobals, workers, testHTTPPort, site)
}

const worker1 = `		worker 1 {
			endpoint 127.0.0.1:9001
			model_name m
		}`

const worker3 = `		worker 3 {
			endpoint 127.0.0.1:9003
			model_name m
		}`

// blankCaddyfile has no kv_router app, so loading it releases the pooled
// router and the next test starts from an empty one.
var blankCaddyfile = fmt.Sprintf(`{
%s}

:%d {
	bind 127.0.0.1
	respond "blank"
}
`, testGlobals, testHTTPPort)

// call sends one request and returns the status and body.
func call(t *testing.T, tester *testCaddy, method, path, contentType, body string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, apiBase+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	res, err := tester.Client.Do(req)
	if err != nil && method == http.MethodGet && errors.Is(err, io.EOF) {
		// Just after a reload, a connection the old server accepted as it
		// shut down is closed unanswered (Caddy's listeners outlive its
		// configs): a GET is asked again, once, on a new connection.
		tester.Client.CloseIdleConnections()
		res, err = tester.Client.Do(req)
	}
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, b
}

// callJSON sends a request and decodes the JSON answer into out, failing
// unless the status is want.
func callJSON(t *testing.T, tester *testCaddy, method, path, body string, want int, out any) {
	t.Helper()
	ct := ""
	if body != "" {
		ct = "application/json"
	}
	code, b := call(t, tester, method, path, ct, body)
	if code != want {
		t.Fatalf("%s %s: status %d, want %d; body %s", method, path, code, want, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: decoding %s: %v", method, path, b, err)
		}
	}
}

func workerIDs(t *testing.T, tester *testCaddy) []uint64 {
	t.Helper()
	var workers []struct {
		WorkerID  uint64 `json:"worker_id"`
		Lifecycle string `json:"lifecycle"`
	}
	callJSON(t, tester, http.MethodGet, "/workers", "", http.StatusOK, &workers)
	ids := make([]uint64, 0, len(workers))
	for _, w := range workers {
		if w.Lifecycle != "schedulable" {
			t.Errorf("worker %d is %s", w.WorkerID, w.Lifecycle)
		}
		ids = append(ids, w.WorkerID)
	}
	return ids
}

func activeRequests(t *testing.T, tester *testCaddy) uint64 {
	t.Helper()
	var loads []struct {
		Loads []struct {
			ActiveRequests uint64 `json:"active_requests"`
		} `json:"loads"`
	}
	callJSON(t, tester, http.MethodGet, "/loads", "", http.StatusOK, &loads)
	var n uint64
	for _, m := range loads {
		for _, l := range m.Loads {
			n += l.ActiveRequests
		}
	}
	return n
}

const worker2JSON = `{"worker_id": 2, "model_name": "m", "endpoint": "127.0.0.1:9002", "block_size": 4}`

// reserve books a selection for an 8-token prompt and returns its id.
func reserve(t *testing.T, tester *testCaddy) string {
	t.Helper()
	var sel struct {
		SelectionID string `json:"selection_id"`
		WorkerID    uint64 `json:"worker_id"`
		Endpoint    string `json:"endpoint"`
	}
	callJSON(t, tester, http.MethodPost, "/select_and_reserve",
		`{"model_name": "m", "token_ids": [1, 2, 3, 4, 5, 6, 7, 8]}`, http.StatusOK, &sel)
	if sel.SelectionID == "" || (sel.WorkerID != 1 && sel.WorkerID != 2) || sel.Endpoint == "" {
		t.Fatalf("unexpected selection %+v", sel)
	}
	return sel.SelectionID
}

// forceReload loads caddyfile through the admin API even when it equals
// the running config, as `caddy reload --force` does.
func forceReload(t *testing.T, caddyfile string) {
	t.Helper()
	if status, body := postLoad(t, caddyfile); status != http.StatusOK {
		t.Fatalf("reload: status %d: %s", status, body)
	}
}

// postLoad posts caddyfile to the admin API's /load, forced, and returns
// the answer.
func postLoad(t *testing.T, caddyfile string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("http://localhost:%d/load", testAdminPort), bytes.NewBufferString(caddyfile))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "text/caddyfile")
	req.Header.Set("Cache-Control", "must-revalidate")
	res, err := adminClient(20 * time.Second).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// reloadFor is forceReload for a test that goes on calling tester: the
// old server's shutdown closes the client's kept-alive connections, and a
// request sent on one as it closes fails with EOF (TestReloadAppliesSettings
// did, once), so the client lets them go first.
func reloadFor(t *testing.T, tester *testCaddy, caddyfile string) {
	t.Helper()
	forceReload(t, caddyfile)
	tester.Client.CloseIdleConnections()
}

func pooledState(t *testing.T) *routerState {
	t.Helper()
	s := runningState()
	if s == nil {
		t.Fatal("no router in the pool")
	}
	return s
}

func (s *routerState) gen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.generation
}

func TestSelectionAPI(t *testing.T) {
	tester := newTester(t)
	tester.InitServer(testCaddyfile(worker1), "caddyfile")

	if got := workerIDs(t, tester); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("declared workers: %v, want [1]", got)
	}
	callJSON(t, tester, http.MethodPost, "/workers", worker2JSON, http.StatusCreated, nil)
	if got := workerIDs(t, tester); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("workers after registering worker 2: %v, want [1 2]", got)
	}

	id := reserve(t, tester)
	if n := activeRequests(t, tester); n != 1 {
		t.Errorf("active requests after booking: %d, want 1", n)
	}
	callJSON(t, tester, http.MethodDelete, "/reservations/"+id, "", http.StatusOK, nil)
	if n := activeRequests(t, tester); n != 0 {
		t.Errorf("active requests after freeing: %d, want 0", n)
	}
	callJSON(t, tester, http.MethodDelete, "/reservations/"+id, "", http.StatusNotFound, nil)

	code, body := call(t, tester, http.MethodPost, "/select", "", `{"model_name": "m", "token_ids": [1, 2, 3, 4]}`)
	if code != http.StatusUnsupportedMediaType || !strings.Contains(string(body), `"error"`) {
		t.Errorf("select without a content type: %d %s, want 415 with an error body", code, body)
	}

	code, body = call(t, tester, http.MethodGet, "/no/such/route", "", "")
	if code != http.StatusNotFound || string(body) != `{"error":"route not found"}` {
		t.Errorf("unknown route: %d %s, want 404 route not found", code, body)
	}

	// The same API under /small/ accepts at most 64 bytes.
	big := `{"model_name": "m", "token_ids": [` + strings.Repeat("1, ", 40) + `1]}`
	code, body = call(t, tester, http.MethodPost, "/small/select", "application/json", big)
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(string(body), `"error"`) {
		t.Errorf("large body under /small/: %d %s, want 413 with an error body", code, body)
	}
	code, body = call(t, tester, http.MethodPost, "/select", "application/json", big)
	if code != http.StatusOK {
		t.Errorf("large body under the default limit: %d %s, want 200", code, body)
	}
	code, body = call(t, tester, http.MethodGet, "/small/health", "", "")
	if code != http.StatusOK || string(body) != `{"status":"ok"}` {
		t.Errorf("health under /small/: %d %s", code, body)
	}
}

func TestReloadKeepsRouterState(t *testing.T) {
	tester := newTester(t)
	cfg := testCaddyfile(worker1)
	tester.InitServer(cfg, "caddyfile")

	callJSON(t, tester, http.MethodPost, "/workers", worker2JSON, http.StatusCreated, nil)
	id := reserve(t, tester)
	state := pooledState(t)
	gen := state.gen()

	reloadFor(t, tester, cfg)

	if s := pooledState(t); s != state || s.gen() != gen+1 {
		t.Fatalf("reload did not reuse the pooled router (same: %t, generation %d → %d)", s == state, gen, s.gen())
	}
	if refs, _ := routers.References(routerKey); refs != 1 {
		t.Errorf("pool references after reload: %d, want 1", refs)
	}
	if got := workerIDs(t, tester); !slices.Equal(got, []uint64{1, 2}) {
		t.Errorf("workers after reload: %v, want [1 2]", got)
	}
	if n := activeRequests(t, tester); n != 1 {
		t.Errorf("active requests after reload: %d, want 1", n)
	}
	callJSON(t, tester, http.MethodDelete, "/reservations/"+id, "", http.StatusOK, nil)
	if n := activeRequests(t, tester); n != 0 {
		t.Errorf("active requests after freeing: %d, want 0", n)
	}
}

// TestReloadAppliesSettings: caddy reload changes the running router's
// settings in place (same router, its reservation kept), except the ones
// that shape what was built with it, which keep their running values.
func TestReloadAppliesSettings(t *testing.T) {
	tester := newTester(t)
	tester.InitServer(testCaddyfile(worker1), "caddyfile")
	id := reserve(t, tester)
	state := pooledState(t)
	if got := state.router.Config(); got.PrefillLoadScale != 1 || got.MaxReservationsPerClient != 1024 {
		t.Fatalf("before the reload: %+v", got)
	}
	changed := strings.Replace(testCaddyfile(worker1), "use_kv_events off",
		"use_kv_events off\n\t\tprefill_load_scale 4\n\t\tmax_reservations_per_client 7\n\t\tmax_reservation_blocks_per_client 99\n\t\tapprox_ttl 10s", 1)
	reloadFor(t, tester, changed)
	if s := pooledState(t); s != state {
		t.Fatal("the reload rebuilt the router")
	}
	got := state.router.Config()
	if got.PrefillLoadScale != 4 || got.MaxReservationsPerClient != 7 || got.MaxReservationBlocksPerClient != 99 {
		t.Errorf("settings not applied: prefill_load_scale %v, max_reservations_per_client %d, max_reservation_blocks_per_client %d",
			got.PrefillLoadScale, got.MaxReservationsPerClient, got.MaxReservationBlocksPerClient)
	}
	if got.ApproxTTL != 120*time.Second {
		t.Errorf("approx_ttl, which the index was built with, changed to %v in place", got.ApproxTTL)
	}
	if n := activeRequests(t, tester); n != 1 {
		t.Errorf("active requests after the reload: %d, want 1", n)
	}
	callJSON(t, tester, http.MethodDelete, "/reservations/"+id, "", http.StatusOK, nil)
}

func TestReloadDeletesWorkerRemovedFromConfig(t *testing.T) {
	tester := newTester(t)
	tester.InitServer(testCaddyfile(worker1+"\n"+worker3), "caddyfile")
	callJSON(t, tester, http.MethodPost, "/workers", worker2JSON, http.StatusCreated, nil)
	if got := workerIDs(t, tester); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("workers: %v, want [1 2 3]", got)
	}

	tester.InitServer(testCaddyfile(worker1), "caddyfile")
	if got := workerIDs(t, tester); !slices.Equal(got, []uint64{1, 2}) {
		t.Errorf("workers after removing worker 3 from the config: %v, want [1 2]", got)
	}

	// Dropping the whole app releases the router and its workers.
	tester.InitServer(blankCaddyfile, "caddyfile")
	if _, ok := routers.References(routerKey); ok {
		t.Error("router still pooled after loading a config without kv_router")
	}
}
