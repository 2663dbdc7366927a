package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"os"
	"reflect"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"
)

// testCaddy is the test process's Caddy as one test sees it: Client
// reaches it and InitServer loads a config into it. It does what
// caddytest.Tester did for these tests (the same client, the same load
// through the admin API, the same check that the config runs), except that
// caddytest's InitServer skips every test under -short; here -short only
// makes the two biggest tests smaller (TestCancelsAtScale,
// TestSoakReloadsUnderTraffic).
type testCaddy struct {
	t *testing.T
	// Client sends every request to 127.0.0.1, whatever the host
	// (caddytest's testing transport), with a 5 s timeout.
	Client *http.Client
	loaded bool
}

// caddyRunning starts the one in-process Caddy, with only its admin
// endpoint on testAdminPort, the first time a test needs it.
var caddyRunning = sync.OnceValue(func() error {
	return caddy.Load(fmt.Appendf(nil, `{"admin":{"listen":"localhost:%d"}}`, testAdminPort), true)
})

// newTester starts from a Caddy with the blank config: no kv_router app,
// so no router left pooled by an earlier test.
func newTester(t *testing.T) *testCaddy {
	t.Helper()
	if err := caddyRunning(); err != nil {
		t.Fatalf("starting Caddy with its admin endpoint on port %d: %v", testAdminPort, err)
	}
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	tester := &testCaddy{t: t, Client: &http.Client{
		Transport: caddytest.CreateTestingTransport(),
		Jar:       jar,
		Timeout:   caddytest.Default.TestRequestTimeout,
	}}
	t.Cleanup(tester.logConfigOnFailure)
	tester.InitServer(blankCaddyfile, "caddyfile")
	if refs, ok := routers.References(routerKey); ok {
		t.Fatalf("router still pooled with %d references after loading a config without kv_router", refs)
	}
	return tester
}

// loadTimeout bounds one config load through the admin API.
const loadTimeout = 30 * time.Second

// InitServer loads config, written for adapter, through the admin API and
// checks that Caddy runs it.
func (tc *testCaddy) InitServer(config, adapter string) {
	tc.t.Helper()
	// Longer than caddytest's 5 s: a reload shuts the old servers down
	// (a 1 s grace period) and its router's listeners, and on two busy
	// cores that can take a few seconds; a load that is truly stuck still
	// fails, with every goroutine's stack.
	client := adminClient(loadTimeout)
	req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("http://localhost:%d/load", testAdminPort), strings.NewReader(config))
	if err != nil {
		tc.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "text/"+adapter)
	res, err := client.Do(req)
	if err != nil {
		// A load that does not finish is stuck somewhere in this process:
		// show where.
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
		tc.t.Fatalf("loading the config: %v", err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || res.StatusCode != http.StatusOK {
		tc.t.Fatalf("loading the config: status %d: %s %v", res.StatusCode, body, err)
	}
	tc.loaded = true

	ad := caddyconfig.GetAdapter(adapter)
	if ad == nil {
		tc.t.Fatalf("no config adapter %q", adapter)
	}
	adapted, _, err := ad.Adapt([]byte(config), nil)
	if err != nil {
		tc.t.Fatalf("adapting the config: %v", err)
	}
	var want any
	if err := json.Unmarshal(adapted, &want); err != nil {
		tc.t.Fatal(err)
	}
	// The load is done when /load answers; the retries are for a
	// config that an earlier load's cleanup could still be replacing.
	for deadline := time.Now().Add(10 * time.Second); !reflect.DeepEqual(want, tc.runningConfig(client)); {
		if time.Now().After(deadline) {
			tc.t.Fatal("the loaded config is not the one running")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// adminClient talks to the admin endpoint on a new connection each
// request. Caddy replaces its admin server on every load, a refused one's
// rollback too, and shuts the old one down in the background, closing its
// idle connections: a request sent on one kept alive from the load before
// was reset (TestFailedLoadLeavesTheRunningRouter failed so in CI, once).
func adminClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
}

// runningConfig is Caddy's running config, decoded, or nil.
func (tc *testCaddy) runningConfig(client *http.Client) any {
	res, err := client.Get(fmt.Sprintf("http://localhost:%d/config/", testAdminPort))
	if err != nil {
		return nil
	}
	defer res.Body.Close()
	var cfg any
	if err := json.NewDecoder(res.Body).Decode(&cfg); err != nil {
		return nil
	}
	return cfg
}

// logConfigOnFailure logs the running config when a test that loaded one
// failed.
func (tc *testCaddy) logConfigOnFailure() {
	if !tc.t.Failed() || !tc.loaded {
		return
	}
	res, err := http.Get(fmt.Sprintf("http://localhost:%d/config/", testAdminPort))
	if err != nil {
		tc.t.Log("unable to read the current config")
		return
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	var out bytes.Buffer
	_ = json.Indent(&out, body, "", "  ")
	tc.t.Logf("----------- failed with config -----------\n%s", out.String())
}
