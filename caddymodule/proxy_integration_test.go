package caddymodule

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// proxyCaddyfile routes completions through kv_router and reverse_proxy
// to the given workers (declared in the kv_router block, events on).
func proxyCaddyfile(workers string) string {
	return fmt.Sprintf(`{
%s	kv_router {
		block_size 4
%s
	}
}

:%d {
	bind 127.0.0.1
	kv_router {
		explain on
		tokenize_timeout 2s
	}
	reverse_proxy {
		dynamic kv_router
		lb_policy kv_router
		lb_retries 2
	}
}
`, testGlobals, workers, testHTTPPort)
}

func workerBlock(w *testWorker) string {
	return fmt.Sprintf(`		worker %d {
			endpoint %s
			model_name m
			kv_events %s
		}
`, w.id, w.addr, w.pubEP)
}

// post sends a completion request and returns the response, read whole.
func post(t *testing.T, tester *testCaddy, path, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, apiBase+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	res, err := tester.Client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res, string(b)
}

func seqTokens(base, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(base + i)
	}
	return out
}

// waitIndexed waits until the index holds n entries for the worker.
func waitIndexed(t *testing.T, id uint64, n int) {
	t.Helper()
	state := pooledState(t)
	key := selection.PartitionKey{Model: "m", Group: "default"}
	deadline := time.Now().Add(10 * time.Second)
	for state.events.Index.Blocks(key, selection.Rank{WorkerID: id}) < n {
		if time.Now().After(deadline) {
			t.Fatalf("worker %d: index never reached %d blocks", id, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitNoReservations(t *testing.T) {
	t.Helper()
	r := pooledState(t).router
	deadline := time.Now().Add(10 * time.Second)
	for r.ActiveReservations() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d reservations still held", r.ActiveReservations())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestProxyRoutesByPrefix(t *testing.T) {
	tester := newTester(t)
	w1, w2 := newTestWorker(t, 1), newTestWorker(t, 2)
	tester.InitServer(proxyCaddyfile(workerBlock(w1)+workerBlock(w2)), "caddyfile")
	w1.waitSubscribed()
	w2.waitSubscribed()

	a, b := seqTokens(100, 64), seqTokens(5000, 64)
	w2.announce(a, 4)
	w1.announce(b, 4)
	waitIndexed(t, 2, 16)
	waitIndexed(t, 1, 16)

	// An integer-array prompt on /v1/completions.
	res, _ := post(t, tester, "/v1/completions", `{"model":"m","prompt":`+tokensJSON(a)+`}`)
	if res.StatusCode != 200 || res.Header.Get("X-KVRouter-Worker") != "2" || res.Header.Get("X-KVRouter-Cached-Tokens") != "64" {
		t.Fatalf("prompt A: status %d worker %q cached %q", res.StatusCode, res.Header.Get("X-KVRouter-Worker"), res.Header.Get("X-KVRouter-Cached-Tokens"))
	}
	if !strings.Contains(res.Header.Get("X-KVRouter-Explain"), "2/0 overlap=16") {
		t.Errorf("explain header %q", res.Header.Get("X-KVRouter-Explain"))
	}
	// token_ids wins over a text prompt.
	res, _ = post(t, tester, "/v1/completions", `{"model":"m","prompt":"ignored","token_ids":`+tokensJSON(b)+`}`)
	if res.Header.Get("X-KVRouter-Worker") != "1" {
		t.Fatalf("token_ids B went to %q", res.Header.Get("X-KVRouter-Worker"))
	}
	// A text prompt is tokenized by a worker, then routed by its tokens.
	text := strings.Repeat("the quick brown fox jumps over the lazy dog. ", 4)
	w1.announce(textTokens(text), 4)
	waitIndexed(t, 1, 16+len(text)/4)
	res, _ = post(t, tester, "/v1/completions", `{"model":"m","prompt":"`+text+`"}`)
	if res.Header.Get("X-KVRouter-Worker") != "1" || w1.tokenized.Load()+w2.tokenized.Load() != 1 {
		t.Fatalf("text prompt: worker %q, tokenize calls %d", res.Header.Get("X-KVRouter-Worker"), w1.tokenized.Load()+w2.tokenized.Load())
	}
	// Chat messages, likewise.
	chat := strings.Repeat("hello there, general kenobi! ", 4)
	w2.announce(textTokens(chat), 4)
	waitIndexed(t, 2, 16+len(chat)/4)
	res, _ = post(t, tester, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"`+chat+`"}]}`)
	if res.Header.Get("X-KVRouter-Worker") != "2" {
		t.Fatalf("chat went to %q", res.Header.Get("X-KVRouter-Worker"))
	}
	// A worker registered at runtime receives traffic without a reload.
	w3 := newTestWorker(t, 3)
	if _, err := pooledState(t).router.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: ptr(uint64(3)), ModelName: ptr("m"),
		Endpoint: ptr(w3.addr), BlockSize: ptr(uint32(4)), KVEventsEndpoint: ptr(w3.pubEP)}); err != nil {
		t.Fatal(err)
	}
	w3.waitSubscribed()
	c := seqTokens(9000, 64)
	w3.announce(c, 4)
	waitIndexed(t, 3, 16)
	res, _ = post(t, tester, "/v1/completions", `{"model":"m","prompt":`+tokensJSON(c)+`}`)
	if res.StatusCode != 200 || res.Header.Get("X-KVRouter-Worker") != "3" || w3.served.Load() != 1 {
		t.Fatalf("runtime worker: status %d worker %q served %d", res.StatusCode, res.Header.Get("X-KVRouter-Worker"), w3.served.Load())
	}
	// A model no worker serves is the gateway's own 404: sent on, it would
	// reach a worker of another model.
	served := w1.served.Load() + w2.served.Load() + w3.served.Load()
	res, _ = post(t, tester, "/v1/completions", `{"model":"other","prompt":[1,2,3]}`)
	if res.StatusCode != 404 || res.Header.Get("X-KVRouter-Worker") != "" || w1.served.Load()+w2.served.Load()+w3.served.Load() != served {
		t.Fatalf("unknown model: status %d worker %q", res.StatusCode, res.Header.Get("X-KVRouter-Worker"))
	}
	// Bad JSON is the client's error.
	if res, _ := post(t, tester, "/v1/completions", `{"model":`); res.StatusCode != 400 {
		t.Fatalf("malformed body: status %d", res.StatusCode)
	}
	waitNoReservations(t)

	// The admin routes and the metrics tell what happened.
	admin := func(path string) string {
		res, err := tester.Client.Get(fmt.Sprintf("http://localhost:%d%s", testAdminPort, path))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", path, res.StatusCode, b)
		}
		return string(b)
	}
	workers := admin("/kv_router/workers")
	if !strings.Contains(workers, `"worker_id":3`) || !strings.Contains(workers, `"indexed_blocks":16`) {
		t.Errorf("/kv_router/workers: %s", workers)
	}
	// Each worker's publisher's own counts: worker 3's events were read
	// and applied, and nothing of its was malformed.
	var listed []struct {
		WorkerID uint64            `json:"worker_id"`
		KVEvents map[string]uint64 `json:"kv_events"`
	}
	if err := json.Unmarshal([]byte(workers), &listed); err != nil {
		t.Fatal(err)
	}
	var three map[string]uint64
	for _, w := range listed {
		if w.WorkerID == 3 {
			three = w.KVEvents
		}
	}
	if three["messages"] == 0 || three["batches"] == 0 || three["malformed"] != 0 {
		t.Errorf("worker 3's kv_events: %v", three)
	}
	if stats := admin("/kv_router/stats"); !strings.Contains(stats, `"active_reservations":0`) || !strings.Contains(stats, `"listeners":3`) {
		t.Errorf("/kv_router/stats: %s", stats)
	}
	metrics := admin("/metrics")
	for _, want := range []string{`kvrouter_requests_total{mode="kv",model="m",outcome="routed"}`, `kvrouter_requests_total{mode="none",model="",outcome="unknown_model"}`,
		`kvrouter_worker_index_blocks{dp_rank="0",worker_id="3"} 16`, `kvrouter_kv_events_connected{dp_rank="0",worker_id="3"} 1`, `kvrouter_selection_duration_seconds_count{model="m"}`, `kvrouter_cached_tokens_total{model="m"}`, `kvrouter_ttft_seconds_count{model="m"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// openCompletion posts body to /v1/completions and returns the answer
// unread (a stream, which the caller reads as far as it means to).
func openCompletion(t *testing.T, tester *testCaddy, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, apiBase+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	res, err := tester.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestProxyStreamingAndRelease(t *testing.T) {
	tester := newTester(t)
	w1 := newTestWorker(t, 1)
	tester.InitServer(proxyCaddyfile(workerBlock(w1)), "caddyfile")
	w1.waitSubscribed()
	router := pooledState(t).router
	body := `{"model":"m","stream":true,"prompt":` + tokensJSON(seqTokens(1, 40)) + `}`

	// The first SSE chunk arrives while the worker holds the rest: nothing
	// is buffered. Meanwhile the reservation is live with prefill done.
	w1.gate = make(chan struct{})
	res := openCompletion(t, tester, body)
	rd := bufio.NewReader(res.Body)
	first, err := rd.ReadString('\n')
	if err != nil || !strings.Contains(first, `"chunk":0`) {
		t.Fatalf("first chunk %q, %v", first, err)
	}
	loads := router.Queries().Loads("m", "")
	if router.ActiveReservations() != 1 || loads[0].Loads[0].PotentialPrefillTokens != 0 {
		t.Fatalf("mid-stream: %d reservations, prefill %d", router.ActiveReservations(), loads[0].Loads[0].PotentialPrefillTokens)
	}
	close(w1.gate)
	rest, _ := io.ReadAll(rd)
	res.Body.Close()
	if !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("stream end missing: %q", rest)
	}
	w1.gate = nil
	waitNoReservations(t)

	// A client that goes away mid-request frees its reservation.
	w1.hang.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, apiBase+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	res, err = tester.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if router.ActiveReservations() != 1 {
		t.Fatalf("hanging request holds %d reservations", router.ActiveReservations())
	}
	cancel()
	res.Body.Close()
	waitNoReservations(t)
	w1.hang.Store(false)

	// A worker that drops the connection mid-stream: the client sees the
	// stream cut, the reservation is freed.
	w1.breakMid.Store(true)
	res, text := post(t, tester, "/v1/completions", body)
	if strings.Contains(text, "[DONE]") {
		t.Fatalf("a broken stream ended normally: %d %q", res.StatusCode, text)
	}
	waitNoReservations(t)
}

func TestProxyFailsOverFromDeadWorker(t *testing.T) {
	tester := newTester(t)
	w1, dead := newTestWorker(t, 1), newTestWorker(t, 2)
	// Worker 2's HTTP port is closed: its events still arrive, so it looks
	// like the best place for its prefix until the dial fails.
	_ = dead.srv.Close()
	cfg := strings.Replace(proxyCaddyfile(workerBlock(w1)+workerBlock(dead)), "block_size 4", "block_size 4\n\t\tworker_down_after 300ms", 1)
	tester.InitServer(cfg, "caddyfile")
	w1.waitSubscribed()
	dead.waitSubscribed()
	p := seqTokens(700, 64)
	dead.announce(p, 4)
	waitIndexed(t, 2, 16)
	before := testCounter(failoversTotal)
	res, _ := post(t, tester, "/v1/completions", `{"model":"m","prompt":`+tokensJSON(p)+`}`)
	if res.StatusCode != 200 || res.Header.Get("X-KVRouter-Worker") != "1" || w1.served.Load() != 1 {
		t.Fatalf("failover: status %d worker %q served %d", res.StatusCode, res.Header.Get("X-KVRouter-Worker"), w1.served.Load())
	}
	if testCounter(failoversTotal) != before+1 {
		t.Fatalf("failovers went from %v to %v", before, testCounter(failoversTotal))
	}
	waitNoReservations(t)
	// After worker_down_after with no success, the dead worker is taken out
	// and its index entries are dropped; new requests go straight to 1.
	state := pooledState(t)
	deadline := time.Now().Add(10 * time.Second)
	for !state.router.Health().WorkerDown(2) || state.events.Index.Blocks(selection.PartitionKey{Model: "m", Group: "default"}, selection.Rank{WorkerID: 2}) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the dead worker was not taken out")
		}
		time.Sleep(10 * time.Millisecond)
	}
	res, _ = post(t, tester, "/v1/completions", `{"model":"m","prompt":`+tokensJSON(p)+`}`)
	if res.StatusCode != 200 || res.Header.Get("X-KVRouter-Worker") != "1" || testCounter(failoversTotal) != before+1 {
		t.Fatalf("after take-out: status %d worker %q failovers %v", res.StatusCode, res.Header.Get("X-KVRouter-Worker"), testCounter(failoversTotal)-before)
	}
	waitNoReservations(t)
	// The take-out is told (it used to show only in clients' 503s): in
	// /kv_router/workers, /kv_router/stats and the metrics.
	var listed []struct {
		WorkerID uint64 `json:"worker_id"`
		TakenOut bool   `json:"taken_out"`
	}
	getAdminJSON(t, tester, "/kv_router/workers", &listed)
	for _, w := range listed {
		if w.TakenOut != (w.WorkerID == 2) {
			t.Errorf("worker %d: taken_out %v", w.WorkerID, w.TakenOut)
		}
	}
	var stats struct {
		TakenOut *int `json:"taken_out_workers"`
	}
	getAdminJSON(t, tester, "/kv_router/stats", &stats)
	if stats.TakenOut == nil || *stats.TakenOut != 1 {
		t.Errorf("taken_out_workers %v, want 1", stats.TakenOut)
	}
	if testCounter(workersTakenOutTotal.WithLabelValues("here")) < 1 {
		t.Error("kvrouter_workers_taken_out_total{by=\"here\"} did not count the take-out")
	}
}

// getAdminJSON decodes GET path on the admin endpoint (adminGet) into v.
func getAdminJSON(t *testing.T, tester *testCaddy, path string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(adminGet(t, tester, path)), v); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}

func TestProxyReloadUnderLoad(t *testing.T) {
	tester := newTester(t)
	w1, w2 := newTestWorker(t, 1), newTestWorker(t, 2)
	cfg := proxyCaddyfile(workerBlock(w1) + workerBlock(w2))
	tester.InitServer(cfg, "caddyfile")
	w1.waitSubscribed()
	w2.waitSubscribed()
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	// A fresh connection per request; only a connection reset before any
	// answer is retried (postRetryingResets). The test then checks that
	// every request was served exactly once.
	client := freshConnClient()
	var retries atomic.Int64
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				body := fmt.Sprintf(`{"model":"m","prompt":%s}`, tokensJSON(seqTokens(g*1000+i%5*10, 32)))
				res, err := postRetryingResets(client, body, func(error) { retries.Add(1) })
				if err != nil {
					errs <- err
					continue
				}
				_, _ = io.ReadAll(res.Body)
				res.Body.Close()
				if res.StatusCode != 200 {
					errs <- fmt.Errorf("status %d", res.StatusCode)
				}
			}
		}()
	}
	gen := pooledState(t).gen()
	for range 5 {
		time.Sleep(50 * time.Millisecond)
		forceReload(t, cfg)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := pooledState(t).gen(); got != gen+5 {
		t.Fatalf("%d reloads happened, want 5", got-gen)
	}
	if served := w1.served.Load() + w2.served.Load(); served != 200 {
		t.Fatalf("workers served %d requests, want 200 (each exactly once)", served)
	}
	t.Logf("%d connection resets retried across the reloads", retries.Load())
	if n := pooledState(t).events.Listeners(); n != 2 {
		t.Fatalf("%d listeners after reloads, want 2", n)
	}
	waitNoReservations(t)
}

// TestProxyStaticUpstreams: with upstreams listed in the Caddyfile instead
// of dynamic kv_router, the policy matches them to catalog workers by
// address.
func TestProxyStaticUpstreams(t *testing.T) {
	tester := newTester(t)
	w1, w2 := newTestWorker(t, 1), newTestWorker(t, 2)
	cfg := strings.Replace(proxyCaddyfile(workerBlock(w1)+workerBlock(w2)), "dynamic kv_router",
		"to "+w1.addr+" "+w2.addr, 1)
	// The placeholders reach other directives, as they reach access logs.
	cfg = strings.Replace(cfg, "\tbind 127.0.0.1\n\tkv_router {", "\tbind 127.0.0.1\n\theader >X-From-Placeholder \"{http.kv_router.worker}/{http.kv_router.cached_tokens}\"\n\tkv_router {", 1)
	tester.InitServer(cfg, "caddyfile")
	w1.waitSubscribed()
	w2.waitSubscribed()
	p := seqTokens(300, 48)
	w2.announce(p, 4)
	waitIndexed(t, 2, 12)
	res, _ := post(t, tester, "/v1/completions", `{"model":"m","prompt":`+tokensJSON(p)+`}`)
	if res.StatusCode != 200 || res.Header.Get("X-KVRouter-Worker") != "2" || w2.served.Load() != 1 {
		t.Fatalf("static upstreams: status %d worker %q served %d", res.StatusCode, res.Header.Get("X-KVRouter-Worker"), w2.served.Load())
	}
	if got := res.Header.Get("X-From-Placeholder"); got != "2/48" {
		t.Errorf("placeholders gave %q, want 2/48", got)
	}
	// Session affinity from the header: a session first seen on worker 2
	// is not pinned without affinity on, but the header is accepted.
	req, _ := http.NewRequest(http.MethodPost, apiBase+"/v1/completions", strings.NewReader(`{"model":"m","prompt":[1,2,3,4]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-ID", "abc")
	res, err := tester.Client.Do(req)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("session header request: %v", err)
	}
	res.Body.Close()
	waitNoReservations(t)
}

// TestProxyNeverDialsOutsideTheCatalog: nothing in a request (body fields,
// Host, forwarding headers) can make the gateway dial an address that is
// not a registered worker.
func TestProxyNeverDialsOutsideTheCatalog(t *testing.T) {
	tester := newTester(t)
	w1 := newTestWorker(t, 1)
	tester.InitServer(proxyCaddyfile(workerBlock(w1)), "caddyfile")
	w1.waitSubscribed()
	evil, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Close()
	var dialed atomic.Int64
	go func() {
		for {
			c, err := evil.Accept()
			if err != nil {
				return
			}
			dialed.Add(1)
			c.Close()
		}
	}()
	ea := evil.Addr().String()
	body := `{"model":"m","prompt":[1,2,3,4,5,6,7,8],"endpoint":"` + ea + `","worker_id":99,` +
		`"pinned_worker":{"worker_id":99,"dp_rank":0},"affinity_target":{"worker_id":99}}`
	for _, hdr := range [][2]string{{"Host", ea}, {"X-Forwarded-Host", ea}, {"X-Routing-Group", ea}, {"X-Session-ID", ea}} {
		req, _ := http.NewRequest(http.MethodPost, apiBase+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if hdr[0] == "Host" {
			req.Host = hdr[1]
		} else {
			req.Header.Set(hdr[0], hdr[1])
		}
		res, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(res.Body)
		res.Body.Close()
		// A routing group nobody serves is refused by the gateway, not
		// sent to a worker of another group.
		want := 200
		if hdr[0] == "X-Routing-Group" {
			want = 503
		}
		if res.StatusCode != want {
			t.Fatalf("%s: status %d, want %d", hdr[0], res.StatusCode, want)
		}
	}
	if dialed.Load() != 0 || w1.served.Load() != 3 {
		t.Fatalf("the unregistered address was dialed %d times; the worker served %d of 3", dialed.Load(), w1.served.Load())
	}
	waitNoReservations(t)
}

// TestProxyBodyLimit: a body over the handler's max_body_size gets 413
// and reaches no worker.
func TestProxyBodyLimit(t *testing.T) {
	tester := newTester(t)
	w1 := newTestWorker(t, 1)
	cfg := strings.Replace(proxyCaddyfile(workerBlock(w1)), "explain on", "explain on\n\t\tmax_body_size 256", 1)
	tester.InitServer(cfg, "caddyfile")
	res, _ := post(t, tester, "/v1/completions", `{"model":"m","prompt":`+tokensJSON(seqTokens(1000, 100))+`}`)
	if res.StatusCode != http.StatusRequestEntityTooLarge || w1.served.Load() != 0 {
		t.Fatalf("oversized body: status %d, served %d", res.StatusCode, w1.served.Load())
	}
	res, _ = post(t, tester, "/v1/completions", `{"model":"m","prompt":[1,2,3,4]}`)
	if res.StatusCode != 200 {
		t.Fatalf("small body: status %d", res.StatusCode)
	}
	waitNoReservations(t)
}

// TestWorkerThatIsTheGatewayItself: a worker whose endpoint is a site of
// the gateway's that the endpoint check cannot see yet (a site the same
// load adds; at first start, any site) used to send each request round
// the gateway about 1,265 times until a header grew too large (431 after
// 2.7 s). The request now comes back marked and is refused with 508 the
// first time.
func TestWorkerThatIsTheGatewayItself(t *testing.T) {
	tester := newTester(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	self := fmt.Sprintf(`		worker 9 {
			endpoint 127.0.0.1:%d
			model_name m
			kv_events tcp://127.0.0.1:9
		}
`, port)
	second := fmt.Sprintf(`
:%d {
	bind 127.0.0.1
	kv_router
	reverse_proxy {
		dynamic kv_router
		lb_policy kv_router
	}
}
`, port)
	tester.InitServer(proxyCaddyfile(self)+second, "caddyfile")
	before := testCounter(requestsTotal.WithLabelValues("m", "routed", "kv"))
	start := time.Now()
	res, body := post(t, tester, "/v1/completions", `{"model":"m","prompt":[1,2,3,4,5,6,7,8]}`)
	if res.StatusCode != http.StatusLoopDetected {
		t.Fatalf("status %d after %v, want 508: %s", res.StatusCode, time.Since(start), body)
	}
	if n := testCounter(requestsTotal.WithLabelValues("m", "routed", "kv")) - before; n > 1 {
		t.Fatalf("the request was routed %v times", n)
	}
}
