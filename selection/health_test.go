package selection

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestWorkerDownAndBack(t *testing.T) {
	// Worker 1's address: taken now, released to be "dead", reused later.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	now := time.Unix(0, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	cfg := DefaultConfig()
	cfg.UseKVEvents = false
	cfg.WorkerDownAfter = 10 * time.Second
	r, err := NewRouter(cfg, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	addWorker(t, r, 1, func(w *WorkerRequest) { w.Endpoint = ptr(addr) })
	addWorker(t, r, 2, nil)
	prompt := &SelectRequest{Prompt: Prompt{TokenIDs: make([]uint32, 64)}, Placement: Placement{PinnedWorker: &PinnedWorker{WorkerID: 1}}}
	res, err := r.SelectAndReserve(prompt)
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Free(res.SelectionID)
	overlap := func() uint64 {
		res, err := r.Select(&SelectRequest{Prompt: Prompt{TokenIDs: make([]uint32, 64)}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Overlap.LongestMatched
	}
	if overlap() != 64 {
		t.Fatal("the booked prompt is not in the index")
	}

	// Failing, but within the grace: still a candidate.
	r.Health().ReportFailure(1)
	advance(5 * time.Second)
	r.Sweep()
	if r.Health().WorkerDown(1) {
		t.Fatal("down before the grace passed")
	}
	// A success clears the failures.
	r.Health().ReportSuccess(1)
	advance(10 * time.Second)
	r.Sweep()
	if r.Health().WorkerDown(1) {
		t.Fatal("down after a success")
	}

	// Failing for longer than the grace: out, and its index entries gone.
	r.Health().ReportFailure(1)
	advance(11 * time.Second)
	r.Sweep()
	if !r.Health().WorkerDown(1) {
		t.Fatal("not down after the grace")
	}
	if _, err := r.Select(prompt); StatusOf(err) != 503 {
		t.Fatalf("a down worker can still be pinned: %v", err)
	}
	for range 20 {
		res, err := r.Select(&SelectRequest{Prompt: Prompt{TokenIDs: make([]uint32, 64)}})
		if err != nil || res.WorkerID != 2 {
			t.Fatalf("selection went to %d (%v), want 2", res.WorkerID, err)
		}
	}
	if overlap() != 0 {
		t.Fatal("the down worker's index entries were kept")
	}
	// A reported success does not bring it back; a healthy answer does.
	r.Health().ReportSuccess(1)
	r.Sweep()
	if !r.Health().WorkerDown(1) {
		t.Fatal("up again without a connection")
	}
	back, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("could not reuse %s: %v", addr, err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	srv.Listener.Close()
	srv.Listener = back
	srv.Start()
	defer srv.Close()
	r.Sweep()
	if r.Health().WorkerDown(1) {
		t.Fatal("still down though its endpoint accepts connections")
	}
	if _, err := r.Select(prompt); err != nil {
		t.Fatalf("the worker came back but cannot be pinned: %v", err)
	}
}

// healthServer is a worker on 127.0.0.1 whose /health answers status()
// (every other path answers 200, so only /health can bring it back).
func healthServer(t *testing.T, status func() int) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			return
		}
		if s := status(); s == http.StatusFound {
			http.Redirect(w, r, "/", s) // to a 200
		} else {
			w.WriteHeader(s)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// TestHealthProbe: a down worker comes back only when GET /health answers
// 2xx: one answering 503 (which accepts connections, so a dial brought it
// back) stays out, as do a redirect and a dead port; one that starts
// answering 200 comes back.
func TestHealthProbe(t *testing.T) {
	dead := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		return addr
	}
	fixed := func(s int) func() int { return func() int { return s } }
	var healthy atomic.Bool
	recovering := func() int {
		if healthy.Load() {
			return http.StatusOK
		}
		return http.StatusServiceUnavailable
	}
	tests := []struct {
		name                string
		endpoint            string
		backFirst, backThen bool // up after the first probe, after the worker turned healthy
	}{
		{"answers 503", healthServer(t, fixed(http.StatusServiceUnavailable)), false, false},
		{"answers 302 to a 200", healthServer(t, fixed(http.StatusFound)), false, false},
		{"a dead port", dead(), false, false},
		{"starts answering 200", healthServer(t, recovering), false, true},
		{"answers 204, endpoint with a scheme", "http://" + healthServer(t, fixed(http.StatusNoContent)) + "/", true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			healthy.Store(false)
			now := time.Unix(0, 0)
			var mu sync.Mutex
			cfg := DefaultConfig() // WorkerDownAfter is on by default
			cfg.UseKVEvents = false
			r, err := NewRouter(cfg, WithClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now }))
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			addWorker(t, r, 1, func(w *WorkerRequest) { w.Endpoint = ptr(tc.endpoint) })
			r.Health().ReportFailure(1)
			mu.Lock()
			now = now.Add(cfg.WorkerDownAfter)
			mu.Unlock()
			r.Sweep()
			if !r.Health().WorkerDown(1) {
				t.Fatal("not down after WorkerDownAfter")
			}
			r.Sweep()
			if up := !r.Health().WorkerDown(1); up != tc.backFirst {
				t.Fatalf("up %v after the first probe, want %v", up, tc.backFirst)
			}
			healthy.Store(true)
			r.Sweep()
			if up := !r.Health().WorkerDown(1); up != tc.backThen {
				t.Fatalf("up %v after a probe of the healthy worker, want %v", up, tc.backThen)
			}
		})
	}
}

// TestReportStatus: 502/503/504 are failures, 429 is neither, anything
// else is a success; a worker answering only 503 is taken out.
func TestReportStatus(t *testing.T) {
	tests := []struct {
		status   int
		failing  bool // the worker is failing afterwards
		clearing bool // a standing failure is cleared
	}{
		{200, false, true}, {404, false, true}, {500, false, true},
		{502, true, false}, {503, true, false}, {504, true, false},
		{429, false, false},
	}
	for _, tc := range tests {
		r := newTestRouter(t, nil)
		addWorker(t, r, 1, nil)
		r.Health().ReportStatus(1, tc.status)
		r.health.mu.Lock()
		_, failing := r.health.workers[1]
		r.health.mu.Unlock()
		if failing != tc.failing {
			t.Errorf("%d: failing %v, want %v", tc.status, failing, tc.failing)
		}
		r.Health().ReportFailure(1)
		r.Health().ReportStatus(1, tc.status)
		r.health.mu.Lock()
		_, failing = r.health.workers[1]
		r.health.mu.Unlock()
		if failing == tc.clearing {
			t.Errorf("%d after a failure: failing %v", tc.status, failing)
		}
	}
}

// TestHealthSweepInterval: health is swept every tenth of WorkerDownAfter
// (it was every half, so 30s meant up to 45s), and a probe never outlasts
// the interval or probeMaxTimeout.
func TestHealthSweepInterval(t *testing.T) {
	for _, tc := range []struct{ grace, every, timeout time.Duration }{
		{30 * time.Second, 3 * time.Second, 2 * time.Second},
		{10 * time.Second, time.Second, time.Second},
		{time.Second, 100 * time.Millisecond, 100 * time.Millisecond},
		{time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond},
	} {
		if got := healthSweepEvery(tc.grace); got != tc.every {
			t.Errorf("grace %v: sweep every %v, want %v", tc.grace, got, tc.every)
		}
		if got := probeTimeout(tc.grace); got != tc.timeout {
			t.Errorf("grace %v: probe timeout %v, want %v", tc.grace, got, tc.timeout)
		}
	}
	if DefaultConfig().WorkerDownAfter != 30*time.Second {
		t.Fatalf("WorkerDownAfter defaults to %v, the docs say 30s", DefaultConfig().WorkerDownAfter)
	}
}

// TestHealthProbeCarriesHeader: WithProbeHeader's header goes with every
// GET /health, so that the gateway can mark its probes as its own
// requests (a worker whose endpoint leads back to it is refused at once).
func TestHealthProbeCarriesHeader(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Values("X-Kvrouter-Via"))
	}))
	defer srv.Close()
	now := time.Unix(0, 0)
	var mu sync.Mutex
	cfg := DefaultConfig()
	cfg.UseKVEvents = false
	r, err := NewRouter(cfg, WithProbeHeader("x-kvrouter-via", "gw-1"),
		WithClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now }))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	addWorker(t, r, 1, func(w *WorkerRequest) { w.Endpoint = ptr(srv.Listener.Addr().String()) })
	r.Health().ReportFailure(1)
	mu.Lock()
	now = now.Add(cfg.WorkerDownAfter)
	mu.Unlock()
	r.Sweep() // taken out
	r.Sweep() // probed
	if v, _ := got.Load().([]string); len(v) != 1 || v[0] != "gw-1" {
		t.Fatalf("the probe carried X-Kvrouter-Via %q, want [gw-1]", v)
	}
}

// TestPeersWordIsCheckedByProbe: another replica's word that a worker is
// down takes it out here only once this router's own probe fails: a
// worker that answers /health stays in, its index entries kept (one
// message took every worker out on every replica until the next probe
// brought it back). A failing one is taken out at the next sweep, on the
// peer's word (not told again), and comes back with its probe.
func TestPeersWordIsCheckedByProbe(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	r := newTestRouter(t, func(c *Config) { c.WorkerDownAfter = time.Hour }) // swept by hand
	addWorker(t, r, 1, func(w *WorkerRequest) { w.Endpoint = ptr(srv.URL) })
	h := r.Health()
	h.ObservedByPeer(1, true)
	if h.WorkerDown(1) {
		t.Fatal("taken out on a peer's word, before any probe")
	}
	r.Sweep()
	if h.WorkerDown(1) || len(h.TakenOut()) != 0 {
		t.Fatal("a worker whose /health answers was taken out on a peer's word")
	}
	healthy.Store(false)
	h.ObservedByPeer(1, true)
	r.Sweep()
	if !h.WorkerDown(1) {
		t.Fatal("a worker a peer said is down, whose /health fails, is still in")
	}
	if len(h.TakenOutHere()) != 0 {
		t.Fatal("a worker taken out on a peer's word is counted as this router's own decision")
	}
	healthy.Store(true)
	r.Sweep()
	if h.WorkerDown(1) {
		t.Fatal("a worker whose /health answers again is still out")
	}
}
