package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// The hardening tests of issue 10 that need a running Caddy: what the proxy
// path answers for requests it must not pass on, which worker answers make
// a worker failed, the response-header bound, and the selection API's
// guards on catalog writes.

// openAIErrorOf decodes an OpenAI-shaped error body, failing the test when
// the body has another shape.
func openAIErrorOf(t *testing.T, body string) openAIErrorBody {
	t.Helper()
	var e openAIError
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == 0 {
		t.Fatalf("not an OpenAI error body (%v): %s", err, body)
	}
	return e.Error
}

func TestProxyRefusesWhatItCannotRoute(t *testing.T) {
	tester := newTester(t)
	w1 := newTestWorker(t, 1)
	cfg := strings.Replace(proxyCaddyfile(workerBlock(w1)), "tokenize_timeout 2s", "tokenize_timeout 2s\n\t\tmax_body_size 1KiB", 1)
	tester.InitServer(cfg, "caddyfile")
	w1.waitSubscribed()

	for _, tc := range []struct {
		name, body string
		status     int
		message    string
	}{
		{"a model no worker serves", `{"model":"other","prompt":[1,2,3]}`, 404, "The model `other` does not exist."},
		{"malformed JSON", `{"model":`, 400, ""},
		{"a wrong shape", `{"model":"m","token_ids":"abc"}`, 422, "token_ids"},
		{"a body over max_body_size", `{"model":"m","prompt":"` + strings.Repeat("x", 2048) + `"}`, 413, "limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, body := post(t, tester, "/v1/completions", tc.body)
			if res.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", res.StatusCode, tc.status, body)
			}
			e := openAIErrorOf(t, body)
			if e.Code != tc.status || !strings.Contains(e.Message, tc.message) || res.Header.Get("X-KVRouter-Worker") != "" {
				t.Fatalf("error %+v, worker header %q", e, res.Header.Get("X-KVRouter-Worker"))
			}
		})
	}
	if n := w1.served.Load(); n != 0 {
		t.Fatalf("the worker of model m answered %d refused requests", n)
	}

	// A served model with no schedulable worker is a 503 from the gateway,
	// not a request sent to whatever upstream the fallback picks.
	if _, err := pooledState(t).router.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: ptr(uint64(9)), ModelName: ptr("half")}); err != nil {
		t.Fatal(err)
	}
	res, body := post(t, tester, "/v1/completions", `{"model":"half","prompt":[1,2,3]}`)
	if res.StatusCode != 503 || openAIErrorOf(t, body).Code != 503 || w1.served.Load() != 0 {
		t.Fatalf("model without a schedulable worker: %d %s (worker 1 served %d)", res.StatusCode, body, w1.served.Load())
	}
	waitNoReservations(t)
}

func TestProxyTakesOutWorkerAnsweringOnly503(t *testing.T) {
	tester := newTester(t)
	broken, good := newTestWorker(t, 1), newTestWorker(t, 2)
	broken.status.Store(http.StatusServiceUnavailable)
	cfg := strings.Replace(proxyCaddyfile(workerBlock(broken)+workerBlock(good)), "block_size 4", "block_size 4\n\t\tworker_down_after 300ms", 1)
	tester.InitServer(cfg, "caddyfile")
	broken.waitSubscribed()
	good.waitSubscribed()
	p := seqTokens(4000, 64)
	broken.announce(p, 4) // its cache makes it the first choice for p
	waitIndexed(t, 1, 16)

	// Its 503s pass through to the client, and each counts as a failure:
	// after worker_down_after it is out, though it accepts connections.
	state := pooledState(t)
	deadline := time.Now().Add(10 * time.Second)
	for !state.router.Health().WorkerDown(1) {
		if time.Now().After(deadline) {
			t.Fatal("a worker answering only 503 was never taken out")
		}
		_, _ = post(t, tester, "/v1/completions", `{"model":"m","prompt":`+tokensJSON(p)+`}`)
		time.Sleep(50 * time.Millisecond)
	}
	res, body := post(t, tester, "/v1/completions", `{"model":"m","prompt":`+tokensJSON(p)+`}`)
	if res.StatusCode != 200 || res.Header.Get("X-KVRouter-Worker") != "2" {
		t.Fatalf("after take-out: %d from %q: %s", res.StatusCode, res.Header.Get("X-KVRouter-Worker"), body)
	}
	// Its /health answers 503 too, so the recovery probe keeps it out...
	// (Sweeps run one after another, so once the fifth probe arrives the
	// fourth one's 503 has been acted on.)
	broken.waitHealthProbes(broken.healthHit.Load(), 5)
	if !state.router.Health().WorkerDown(1) {
		t.Fatal("a worker whose /health answers 503 was brought back")
	}
	// ...until it is well again.
	broken.status.Store(0)
	deadline = time.Now().Add(10 * time.Second)
	for state.router.Health().WorkerDown(1) {
		if time.Now().After(deadline) {
			t.Fatal("the mended worker never came back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitNoReservations(t)
}

func TestProxyFullWorkerIsNotAFailedOne(t *testing.T) {
	tester := newTester(t)
	full := newTestWorker(t, 1)
	full.status.Store(http.StatusTooManyRequests)
	cfg := strings.Replace(proxyCaddyfile(workerBlock(full)), "block_size 4", "block_size 4\n\t\tworker_down_after 200ms", 1)
	tester.InitServer(cfg, "caddyfile")
	full.waitSubscribed()
	state := pooledState(t)
	for range 10 {
		res, body := post(t, tester, "/v1/completions", `{"model":"m","prompt":[1,2,3,4,5,6,7,8]}`)
		if res.StatusCode != 429 || !strings.Contains(body, `"object":"error"`) {
			t.Fatalf("a full worker's answer was not passed through: %d %s", res.StatusCode, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if state.router.Health().WorkerDown(1) {
		t.Fatal("a worker answering 429 was taken out as failed")
	}
	waitNoReservations(t)
}

func TestProxyBoundsResponseHeaders(t *testing.T) {
	for _, tc := range []struct {
		name, policy, transport string
	}{
		{"the policy's bound on the default transport", "response_header_timeout 300ms", ""},
		{"the transport's own bound wins over the policy's default", "", "transport http {\n\t\t\tresponse_header_timeout 300ms\n\t\t}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tester := newTester(t)
			stuck := newTestWorker(t, 1)
			stuck.hangBeforeHeaders.Store(true)
			cfg := proxyCaddyfile(workerBlock(stuck))
			cfg = strings.Replace(cfg, "lb_policy kv_router", "lb_policy kv_router {\n\t\t\t"+tc.policy+"\n\t\t}\n\t\t"+tc.transport, 1)
			cfg = strings.Replace(cfg, "lb_retries 2", "", 1)
			tester.InitServer(cfg, "caddyfile")
			stuck.waitSubscribed()
			start := time.Now()
			res, body := post(t, tester, "/v1/completions", `{"model":"m","prompt":[1,2,3,4]}`)
			if res.StatusCode != http.StatusGatewayTimeout || openAIErrorOf(t, body).Code != 504 {
				t.Fatalf("status %d after %v: %s", res.StatusCode, time.Since(start), body)
			}
			waitNoReservations(t)
		})
	}
}

// selectionAPICaddyfile serves the selection API on the test port with the
// given kv_selection block body.
func selectionAPICaddyfile(selectionBlock string) string {
	return approxCaddyfile("", "\tkv_selection {\n"+selectionBlock+"\n\t}")
}

func TestSelectionAPIRefusesEndpointsOfTheGatewayItself(t *testing.T) {
	tester := newTester(t)
	tester.InitServer(selectionAPICaddyfile(""), "caddyfile")
	for _, tc := range []struct {
		endpoint string
		want     int
		reason   string
	}{
		{fmt.Sprintf("127.0.0.1:%d", testAdminPort), 422, "admin listener"},
		{fmt.Sprintf("localhost:%d", testAdminPort), 422, "admin listener"},
		{fmt.Sprintf("http://127.0.0.1:%d/", testAdminPort), 422, "admin listener"},
		{fmt.Sprintf("127.0.0.1:%d", testHTTPPort), 422, "own listener"},
		{fmt.Sprintf("localhost:%d", testHTTPPort), 422, "own listener"},
		{"127.0.0.1:1", 201, ""}, // nobody's: accepted, and simply unreachable
	} {
		code, body := call(t, tester, http.MethodPost, "/workers", "application/json",
			fmt.Sprintf(`{"worker_id":7,"model_name":"m","endpoint":%q}`, tc.endpoint))
		if code != tc.want || !strings.Contains(string(body), tc.reason) {
			t.Errorf("endpoint %s: %d %s, want %d naming %q", tc.endpoint, code, body, tc.want, tc.reason)
		}
	}
	// A worker registered with a good endpoint cannot be moved onto the
	// gateway by a patch either.
	code, body := call(t, tester, http.MethodPatch, "/workers/7", "application/json",
		fmt.Sprintf(`{"endpoint":"127.0.0.1:%d"}`, testAdminPort))
	if code != 422 {
		t.Fatalf("patch onto the admin listener: %d %s", code, body)
	}
}

func TestSelectionAPIWriteToken(t *testing.T) {
	t.Setenv("KVROUTER_TEST_WRITE_TOKEN", "s3cret")
	tester := newTester(t)
	tester.InitServer(selectionAPICaddyfile("\t\twrite_token {env.KVROUTER_TEST_WRITE_TOKEN}"), "caddyfile")
	send := func(method, path, auth, body string) int {
		req, _ := http.NewRequest(method, apiBase+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	reg := `{"worker_id":5,"model_name":"m","endpoint":"127.0.0.1:1"}`
	for _, tc := range []struct {
		name, method, path, auth, body string
		want                           int
	}{
		{"register without a token", "POST", "/workers", "", reg, 401},
		{"register with another token", "POST", "/workers", "Bearer wrong", reg, 403},
		{"register with a basic credential", "POST", "/workers", "Basic czNjcmV0", reg, 401},
		{"register with the token", "POST", "/workers", "Bearer s3cret", reg, 201},
		{"patch without a token", "PATCH", "/workers/5", "", `{"model_name":"x"}`, 401},
		{"delete with another token", "DELETE", "/workers/5", "Bearer s3cre", "", 403},
		{"reads stay open", "GET", "/workers", "", "", 200},
		{"delete with the token", "DELETE", "/workers/5", "Bearer s3cret", "", 200},
	} {
		if got := send(tc.method, tc.path, tc.auth, tc.body); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestSelectionAPIWriteTokenMustNotBeEmpty(t *testing.T) {
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(
		[]byte(selectionAPICaddyfile("\t\twrite_token {env.KVROUTER_TEST_UNSET_VARIABLE}")), nil)
	if err != nil {
		t.Fatal(err)
	}
	var cfg caddy.Config
	if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
		t.Fatal(err)
	}
	if err := caddy.Validate(&cfg); err == nil || !strings.Contains(err.Error(), "write_token") {
		t.Fatalf("a write_token whose variable is unset was accepted: %v", err)
	}
}

// TestSelectionAPIWriteTokenFromAnUnsetCaddyfileVariable: {$VAR} is
// replaced as the Caddyfile is read. Unquoted, an unset variable leaves
// no argument (refused); quoted, it leaves an empty one, which used to
// drop the token from the JSON and open catalog writes to every loopback
// client without a word.
func TestSelectionAPIWriteTokenFromAnUnsetCaddyfileVariable(t *testing.T) {
	for _, line := range []string{"write_token {$KVROUTER_TEST_UNSET_VARIABLE}", `write_token "{$KVROUTER_TEST_UNSET_VARIABLE}"`} {
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(selectionAPICaddyfile("\t\t"+line)), nil)
		if err == nil || !strings.Contains(err.Error(), "write_token") {
			t.Errorf("%s, its variable unset, was adapted: %v", line, err)
		}
	}
}
