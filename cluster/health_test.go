package cluster

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// healthRouter is a router whose worker 3 is served by srv (its /health
// answers as srv says), with workers taken out after 100ms of failures.
func healthRouter(t *testing.T, srv *httptest.Server) *selection.Router {
	t.Helper()
	return healthRouterAfter(t, srv, 100*time.Millisecond)
}

// healthRouterAfter is healthRouter with workers taken out after grace
// (and swept every tenth of it).
func healthRouterAfter(t *testing.T, srv *httptest.Server, grace time.Duration) *selection.Router {
	t.Helper()
	cfg := selection.DefaultConfig()
	cfg.UseKVEvents = false
	cfg.WorkerDownAfter = grace
	r, err := selection.NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	id, ep, bs := uint64(3), srv.URL, uint32(16)
	if _, err := r.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: &id, Endpoint: &ep, BlockSize: &bs}); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestWorkerHealthShared: a worker A takes out (it failed A's requests
// past the grace) is taken out on B, which saw no failure; once its
// /health answers, it is back on both; what a replica applied it does
// not tell back.
func TestWorkerHealthShared(t *testing.T) {
	var healthy atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	s := natsServer(t, 0)
	a, b := healthRouter(t, srv), healthRouter(t, srv)
	ra, rb := joinedPair(t, a, b, s.ClientURL(), nil)

	a.Health().ReportStatus(3, http.StatusBadGateway)
	waitFor(t, 3*time.Second, "A takes worker 3 out", func() bool { return a.Health().WorkerDown(3) })
	waitFor(t, 2*time.Second, "B takes it out too", func() bool { return b.Health().WorkerDown(3) })
	healthy.Store(true)
	waitFor(t, 3*time.Second, "worker 3 back on both", func() bool { return !a.Health().WorkerDown(3) && !b.Health().WorkerDown(3) })
	// B saw no failure: only A's word took it out there. The return was
	// seen by A's probe, B's, or both; each replica tells only its own
	// decisions (at most out and back for A, back for B), never one it
	// applied.
	time.Sleep(200 * time.Millisecond)
	sa, sb := ra.Stats(), rb.Stats()
	if sb.HealthApplied == 0 || sa.HealthShared == 0 || sa.HealthShared > 2 || sb.HealthShared > 1 {
		t.Fatalf("shared a %d b %d, applied a %d b %d", sa.HealthShared, sb.HealthShared, sa.HealthApplied, sb.HealthApplied)
	}
}

// TestWorkerTakenOutWhileAwayIsAnnounced: a worker A takes out while NATS
// is away (its word then reaches nobody) is taken out on B once NATS is
// back, from A's announcement; B saw no failure of its own.
func TestWorkerTakenOutWhileAwayIsAnnounced(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	s := natsServer(t, 0)
	url := s.ClientURL()
	port, _ := strconv.Atoi(url[strings.LastIndexByte(url, ':')+1:])
	a, b := healthRouter(t, srv), healthRouter(t, srv)
	ra, rb := joinedPair(t, a, b, url, nil)

	s.Shutdown()
	s.WaitForShutdown()
	waitFor(t, 2*time.Second, "both route alone", func() bool { return !ra.Stats().Connected && !rb.Stats().Connected })
	a.Health().ReportStatus(3, http.StatusBadGateway)
	waitFor(t, 3*time.Second, "A takes worker 3 out", func() bool { return a.Health().WorkerDown(3) })
	if b.Health().WorkerDown(3) {
		t.Fatal("B took worker 3 out with NATS away and no failure of its own")
	}

	natsServer(t, port)
	waitFor(t, 5*time.Second, "B takes worker 3 out from A's announcement", func() bool { return b.Health().WorkerDown(3) })
	// B applied it and does not tell it back: it took nothing out itself.
	if got := b.Health().TakenOutHere(); len(got) != 0 {
		t.Fatalf("B counts %v as its own decisions", got)
	}
}

// TestLateReplicaLearnsDownWorker: a replica that joins after A took a
// worker out learns it from the announcement its hello asks for.
func TestLateReplicaLearnsDownWorker(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	s := natsServer(t, 0)
	a, b := healthRouter(t, srv), healthRouter(t, srv)
	startReplica(t, a, s.ClientURL(), "a", nil)
	a.Health().ReportStatus(3, http.StatusBadGateway)
	waitFor(t, 3*time.Second, "A takes worker 3 out", func() bool { return a.Health().WorkerDown(3) })

	startReplica(t, b, s.ClientURL(), "b", nil)
	waitFor(t, 5*time.Second, "B, joining later, takes worker 3 out", func() bool { return b.Health().WorkerDown(3) })
}

// TestPeersDownWordOnAHealthyWorker: a peer's message that a worker is
// down, about a worker whose /health answers, takes it out nowhere, how
// often it comes: a flood of such messages took every worker out on every
// replica (503 to 769 of 1,024 requests while the workers served).
func TestPeersDownWordOnAHealthyWorker(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	s := natsServer(t, 0)
	// Swept by hand: a worker taken out stays out until a sweep's probe.
	b := healthRouterAfter(t, srv, time.Hour)
	rb := startReplica(t, b, s.ClientURL(), "b", nil)
	nc := hostilePeer(t, s.ClientURL())
	for i := range 20 {
		publishEnvelope(t, nc, "evil", 1, []event{{Kind: kindHealth, Worker: 3, Down: true}})
		if b.Health().WorkerDown(3) {
			t.Fatalf("taken out after %d messages", i+1)
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitFor(t, 2*time.Second, "B heard the messages", func() bool { return rb.Stats().HealthApplied > 0 })
	if b.Health().WorkerDown(3) {
		t.Fatal("a worker whose /health answers was taken out on a peer's word")
	}
	b.Sweep() // its probe answers: the suspicion is cleared
	if b.Health().WorkerDown(3) {
		t.Fatal("taken out by the sweep that probed it healthy")
	}
}
