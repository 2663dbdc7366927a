package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// startNATS runs the official NATS server on a port the OS chose, with
// JetStream (in the test's directory) when asked, until the test ends.
func startNATS(t *testing.T, jetStream bool) *server.Server {
	t.Helper()
	opts := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true}
	if jetStream {
		opts.JetStream, opts.StoreDir = true, t.TempDir()
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

// waitConnections waits until the NATS server holds exactly these
// replicas' connections (by their client names).
func waitConnections(t *testing.T, ns *server.Server, what string, names ...string) {
	t.Helper()
	var got []string
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(10 * time.Millisecond) {
		connz, err := ns.Connz(&server.ConnzOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got = got[:0]
		for _, c := range connz.Conns {
			got = append(got, c.Name)
		}
		slices.Sort(got)
		if slices.Equal(got, names) {
			return
		}
	}
	t.Fatalf("%s: NATS connections %v, want %v", what, got, names)
}

// TestFailedLoadKeepsTheRunningReplica: a load whose cluster settings
// differ closes the running config's replica link before its own starts;
// when that load fails (another app failing to start stops its kv_router
// app, or its own replica failing to start), the running config's link is
// opened again. It was left closed: the gateway that kept running stayed
// off NATS, and posting its config again was "config is unchanged". A
// load that commits keeps its own link, and the replaced one stays closed.
func TestFailedLoadKeepsTheRunningReplica(t *testing.T) {
	ns := startNATS(t, false)
	cfg := selection.DefaultConfig()
	cfg.UseKVEvents = false
	router, err := selection.NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(router.Close)
	settings := func(name, credentials string) *ClusterConfig {
		return &ClusterConfig{Cluster: &ClusterSettings{URLs: []string{ns.ClientURL()}, Name: name, Credentials: credentials}}
	}
	connected := func(what string, names ...string) {
		t.Helper()
		waitConnections(t, ns, what, names...)
	}
	running, err := settings("a", "").start(router, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	connected("the running config", "kvrouter-a")

	failing, err := settings("b", "").start(router, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	connected("a load with other settings", "kvrouter-b")
	failing.stop() // the load failed after its kv_router app started
	connected("after the failed load", "kvrouter-a")
	if runningReplica() == nil {
		t.Fatal("no running replica after the failed load")
	}

	if _, err := settings("c", "/nonexistent/creds").start(router, 1, nil); err == nil {
		t.Fatal("a replica with missing credentials started")
	}
	connected("after a load whose replica failed to start", "kvrouter-a")

	committed, err := settings("d", "").start(router, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	running.stop() // the load committed: the old config stops
	connected("after a load that committed", "kvrouter-d")
	committed.stop()
	connected("with no config running")
	if runningReplica() != nil {
		t.Fatal("a replica left running with no config")
	}
}

// TestLoadFailingAfterStartKeepsTheRunningReplica: a load that fails
// after all its apps started (here its config loader, which Caddy sets up
// last) is cleaned up by Caddy without being stopped. The running config
// kept the failed config's replica link, under its name, and posting the
// running config again was "config is unchanged".
func TestLoadFailingAfterStartKeepsTheRunningReplica(t *testing.T) {
	tester := newTester(t)
	ns := startNATS(t, false)
	named := func(name string) string {
		return factsCaddyfile("/dev/null", strings.Replace(clusterOptions(ns.ClientURL()), "name gw", "name "+name, 1))
	}
	tester.InitServer(named("a"), "caddyfile")
	waitConnections(t, ns, "the running config", "kvrouter-a")

	adapted, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(named("b")), nil)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(adapted, &cfg); err != nil {
		t.Fatal(err)
	}
	admin, _ := cfg["admin"].(map[string]any)
	if admin == nil {
		t.Fatalf("the adapted config has no admin block: %s", adapted)
	}
	// A loader whose URL refuses connections: it fails once every app
	// has started.
	admin["config"] = map[string]any{"load": map[string]any{"module": "http", "url": "http://127.0.0.1:1/config"}}
	body, _ := json.Marshal(cfg)
	req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("http://localhost:%d/load", testAdminPort), bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	res, err := adminClient(20 * time.Second).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode == http.StatusOK {
		t.Fatalf("the load with a failing config loader went through: %s", answer)
	}
	waitConnections(t, ns, "after the failed load", "kvrouter-a")
}
