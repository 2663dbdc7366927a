package caddymodule

import (
	"slices"
	"testing"
	"time"

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
	// connected waits until the NATS server holds exactly these replicas'
	// connections.
	connected := func(what string, names ...string) {
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
