package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/kvrouter/caddy-kvrouter/cluster"
	"github.com/kvrouter/caddy-kvrouter/selection"
)

// clusterOptions are the kv_router options of the gateway in the cluster
// test: one worker, approximate mode, and a cluster block on url.
func clusterOptions(url string) string {
	return fmt.Sprintf(`		block_size 16
		use_kv_events off
		worker 1 {
			endpoint 127.0.0.1:9
		}
		cluster %s {
			name gw
			heartbeat 50ms
			lease 300ms
		}`, url)
}

// TestClusterGatewayAndPeer: the gateway (real Caddy, its cluster block)
// and a peer replica (a router with the cluster package, as another
// gateway process runs it) on the official NATS server: each sees the
// other's bookings, a reload with the same settings keeps the link, and a
// gateway whose config drops the cluster block stops counting on the peer
// within the lease.
func TestClusterGatewayAndPeer(t *testing.T) {
	ns := startNATS(t, true)

	// The peer shares the gateway's routing settings: its fingerprint is
	// the one the gateway computes from the same options.
	var app App
	if err := app.UnmarshalCaddyfile(caddyfile.NewTestDispenser("kv_router {\n" + clusterOptions(ns.ClientURL()) + "\n}")); err != nil {
		t.Fatal(err)
	}
	cfg := selection.DefaultConfig()
	cfg.UseKVEvents = false
	peer, err := selection.NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(peer.Close)
	id, ep, bs := uint64(1), "127.0.0.1:9", uint32(16)
	if _, err := peer.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: &id, Endpoint: &ep, BlockSize: &bs}); err != nil {
		t.Fatal(err)
	}
	rep, err := cluster.Start(peer, cluster.Config{URLs: []string{ns.ClientURL()}, Name: "peer",
		Heartbeat: 50 * time.Millisecond, Lease: 300 * time.Millisecond,
		Fingerprint: app.settingsFingerprint(), Version: buildVersion()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rep.Close)

	tester := newTester(t)
	gwConfig := factsCaddyfile("/dev/null", clusterOptions(ns.ClientURL()))
	tester.InitServer(gwConfig, "caddyfile")
	api := fmt.Sprintf("http://127.0.0.1:%d/api", testHTTPPort)
	gwActive := func() string {
		res, err := tester.Client.Get(api + "/loads")
		if err != nil {
			return err.Error()
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b)
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		for start := time.Now(); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Since(start) > 5*time.Second {
				t.Fatalf("after 5s: %s (peer stats %+v; gateway loads %s)", what, rep.Stats(), gwActive())
			}
		}
	}
	waitUntil("the peer hears the gateway", func() bool { return rep.Stats().Peers == 1 })

	// A booking on the peer shows in the gateway's /loads.
	sid, isl := "peer-1", uint64(64)
	if _, err := peer.CreateReservation(&selection.ReservationRequest{SelectionID: &sid, WorkerID: &id,
		Prompt: selection.Prompt{SequenceHashes: []uint64{1, 2, 3, 4}, ISLTokens: &isl}}); err != nil {
		t.Fatal(err)
	}
	waitUntil("the gateway's /loads counts the peer's booking", func() bool {
		return strings.Contains(gwActive(), `"active_requests":1`)
	})

	// A booking on the gateway (its selection API) shows on the peer.
	res, err := tester.Client.Post(api+"/select_and_reserve", "application/json",
		strings.NewReader(`{"block_hashes":[7,8],"sequence_hashes":[7,8],"isl_tokens":32,"selection_id":"gw-1"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("select_and_reserve: %d %s", res.StatusCode, body)
	}
	waitUntil("the peer counts the gateway's booking", func() bool { return peer.Remote().Count("gw") == 1 })

	// A worker registered through the gateway's API is on the peer; the
	// worker its Caddyfile declares is not sent (the peer has its own 1).
	res, err = tester.Client.Post(api+"/workers", "application/json",
		strings.NewReader(`{"worker_id":5,"endpoint":"127.0.0.1:19","block_size":16}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("POST /workers: %d %s", res.StatusCode, body)
	}
	waitUntil("the peer has the gateway's registered worker", func() bool {
		w, ok := peer.Catalog().Worker(5)
		return ok && w.Schedulable()
	})
	// The peer counts a write just after it applies it.
	waitUntil("the peer counts the write", func() bool { return rep.Stats().CatalogApplied >= 1 })
	if st := rep.Stats(); st.CatalogApplied != 1 {
		t.Fatalf("the peer applied %d catalog writes, want 1 (the declared worker is not shared)", st.CatalogApplied)
	}

	// A reload that changes nothing the replicas share (engine facts are
	// local): the link is kept, nothing is lost.
	tester.InitServer(factsCaddyfile("/dev/null", clusterOptions(ns.ClientURL())+"\n\t\tengine_facts off"), "caddyfile")
	time.Sleep(400 * time.Millisecond) // past the lease
	if n := peer.Remote().Count("gw"); n != 1 {
		t.Fatalf("after a reload with the same settings the peer holds %d of the gateway's bookings, want 1", n)
	}
	if !strings.Contains(gwActive(), `"active_requests":2`) {
		t.Fatalf("after the reload the gateway's loads are %s, want both bookings", gwActive())
	}

	// A config without the cluster block: the gateway leaves, and its
	// bookings stop counting on the peer within the lease.
	tester.InitServer(factsCaddyfile("/dev/null", "\t\tblock_size 16\n\t\tuse_kv_events off\n\t\tworker 1 {\n\t\t\tendpoint 127.0.0.1:9\n\t\t}"), "caddyfile")
	waitUntil("the peer drops the gateway's bookings", func() bool { return peer.Remote().Count("gw") == 0 })
	if !strings.Contains(gwActive(), `"active_requests":1`) {
		t.Fatalf("the gateway, alone, still counts the peer's booking: %s", gwActive())
	}
}
