package selection

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Worker health: a worker that the proxy cannot reach or that answers
// 502/503/504, and that has not answered otherwise since, is taken out of
// the candidates once WorkerDownAfter has passed, and its index entries are
// dropped (its cache is presumed gone). While it is down it is probed with
// GET /health (vLLM and SGLang both serve it) on every health sweep; the
// first 2xx brings it back (with an empty index, filled again by its events
// or bookings). A TCP connection alone is not enough: a worker answering
// 503 to everything accepts connections, and would flap back in.

const (
	// probeMaxTimeout bounds one health probe: a healthy engine answers
	// /health in milliseconds, and a sweep must not stall on a host that
	// swallows packets.
	probeMaxTimeout = 2 * time.Second
	// probeMaxBody is how much of a probe's answer is read (so the
	// connection closes cleanly); the status is all that matters.
	probeMaxBody = 4 << 10
	// probeMaxHeader bounds a probe answer's headers.
	probeMaxHeader = 16 << 10
	// probeParallel is how many down workers are probed at once, so a
	// dead fleet is probed in a few timeouts, not one per worker.
	probeParallel = 32
)

// probeClient follows no redirects (a 3xx is not healthy), uses no proxy
// from the environment and keeps no connections between sweeps.
var probeClient = &http.Client{
	Transport: &http.Transport{
		Proxy:                  nil,
		DisableKeepAlives:      true,
		MaxResponseHeaderBytes: probeMaxHeader,
	},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

type workerHealth struct {
	failingSince time.Time // first failure since the last success
	down         bool
	// byPeer: taken out on another replica's word (ObservedByPeer), not
	// by this router's sweep; a replica announcing afresh re-tells only
	// its own decisions (TakenOutHere).
	byPeer bool
	// suspect: another replica said it is down; the next sweep's probe
	// says whether it is taken out here (ObservedByPeer).
	suspect bool
}

// Health tracks the failures callers report (ReportStatus) and takes
// workers out of the candidates, and back, on its sweep. It reads the
// catalog for the workers' endpoints and partitions.
type Health struct {
	cfg     *liveConfig // its WorkerDownAfter is the grace; 0 turns the sweep off
	now     func() time.Time
	catalog *Catalog

	mu      sync.Mutex
	workers map[uint64]*workerHealth
	// busy holds, per worker that answered "overloaded", when its mark
	// ends (busy.go).
	busy map[uint64]time.Time
	// out hears this router's decisions, for the other replicas (replica_health.go).
	out healthOut
	// changed hears every take-out and return (OnChange); nil for none.
	changed atomic.Pointer[func(id uint64, down, byPeer bool)]
	// probeHeader is sent with every GET /health (WithProbeHeader).
	probeHeader http.Header
}

// OnChange sets fn to hear each worker taken out (down) or brought back,
// and whether on another replica's word: a worker out of the candidates
// is otherwise seen only in its clients' 503s (the catalog still lists it
// schedulable). fn runs on the sweep's goroutine or the replica link's,
// with no lock held.
func (h *Health) OnChange(fn func(id uint64, down, byPeer bool)) { h.changed.Store(&fn) }

// TakenOut lists the workers out of the candidates for failing, here or
// on another replica's word, sorted.
func (h *Health) TakenOut() []uint64 {
	h.mu.Lock()
	out := make([]uint64, 0, len(h.workers))
	for id, w := range h.workers {
		if w.down {
			out = append(out, id)
		}
	}
	h.mu.Unlock()
	slices.Sort(out)
	return out
}

// tell passes a take-out or return to OnChange's fn.
func (h *Health) tell(id uint64, down, byPeer bool) {
	if fn := h.changed.Load(); fn != nil {
		(*fn)(id, down, byPeer)
	}
}

// ReportFailure records that a worker failed a request: a dial error, or
// a 502, 503 or 504 answer. ReportStatus sorts answers this way.
func (h *Health) ReportFailure(workerID uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.workers == nil {
		h.workers = map[uint64]*workerHealth{}
	}
	w := h.workers[workerID]
	if w == nil {
		w = &workerHealth{}
		h.workers[workerID] = w
	}
	if w.failingSince.IsZero() {
		w.failingSince = h.now()
	}
}

// ReportSuccess records that a worker answered (any status but 429, 502,
// 503 and 504); it clears its failures. It does not bring back a worker
// that is down: only its health probe does.
func (h *Health) ReportSuccess(workerID uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if w := h.workers[workerID]; w != nil && !w.down {
		delete(h.workers, workerID)
	}
}

// ReportStatus records a worker's HTTP answer: 502, 503 and 504 are
// failures (the engine is gone, or answers nothing useful), 429 is neither
// (a full worker is not a failed one: its load accounting already steers
// requests away), anything else is a success.
func (h *Health) ReportStatus(workerID uint64, status int) {
	switch status {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		h.ReportFailure(workerID)
	case http.StatusTooManyRequests:
	default:
		h.ReportSuccess(workerID)
	}
}

// forget drops a worker's failure history and busy mark.
func (h *Health) forget(id uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.workers, id)
	delete(h.busy, id)
}

// WorkerDown reports whether the router has taken a worker out as
// unreachable.
func (h *Health) WorkerDown(workerID uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.workers[workerID]
	return w != nil && w.down
}

// healthSweepEvery is how often health is swept for a grace period: a
// tenth of it, so a worker is taken out within 10% of WorkerDownAfter.
// With the sweep off, it only looks once a second for a Reconfigure that
// turns it on.
func healthSweepEvery(grace time.Duration) time.Duration {
	if grace <= 0 {
		return time.Second
	}
	return max(grace/10, 10*time.Millisecond)
}

// probeTimeout is one probe's timeout: within the sweep interval, so
// sweeps do not pile up, and at most probeMaxTimeout.
func probeTimeout(grace time.Duration) time.Duration {
	return min(max(grace/10, 100*time.Millisecond), probeMaxTimeout)
}

// sweep takes out workers failing for longer than WorkerDownAfter
// and brings back the down ones whose /health answers 2xx.
func (h *Health) sweep() {
	grace := h.cfg.get().WorkerDownAfter
	if grace <= 0 {
		return
	}
	now := h.now()
	var takeOut []uint64
	probe := map[uint64]*workerHealth{}
	h.mu.Lock()
	for id, w := range h.workers {
		switch {
		case w.down:
			probe[id] = w
		case !w.failingSince.IsZero() && now.Sub(w.failingSince) >= grace:
			w.down, w.suspect = true, false
			takeOut = append(takeOut, id)
		case w.suspect:
			probe[id] = w // a peer said it is down: see for ourselves
		}
	}
	h.mu.Unlock()
	for _, id := range takeOut {
		h.setDown(id, true, false)
		h.shared(id, true)
	}
	sem := make(chan struct{}, probeParallel)
	var wg sync.WaitGroup
	for id, w := range probe {
		rec, ok := h.catalog.Worker(id)
		if !ok {
			h.mu.Lock()
			if h.workers[id] == w {
				delete(h.workers, id) // deleted from the catalog meanwhile
			}
			h.mu.Unlock()
			continue
		}
		if rec.Endpoint == nil {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func(id uint64, w *workerHealth, endpoint string) {
			defer wg.Done()
			defer func() { <-sem }()
			healthy := probeHealthy(endpoint, probeTimeout(grace), h.probeHeader)
			if h.settleSuspect(id, w, healthy) || !healthy {
				return
			}
			h.mu.Lock()
			back := h.workers[id] == w // not re-registered or forgotten meanwhile
			if back {
				delete(h.workers, id)
			}
			h.mu.Unlock()
			if back {
				h.setDown(id, false, false)
				h.shared(id, false)
			}
		}(id, w, *rec.Endpoint)
	}
	wg.Wait()
}

// setDown marks a worker's ranks down (out of the candidates, index
// entries dropped) or up again, here or on a peer's word (byPeer), and
// tells OnChange's fn.
func (h *Health) setDown(id uint64, down, byPeer bool) {
	defer h.tell(id, down, byPeer)
	rec, ok := h.catalog.Worker(id)
	if !ok {
		return
	}
	key := rec.Partition()
	if p := h.catalog.partition(key); p != nil {
		p.mu.Lock()
		for _, rs := range p.ranks {
			if rs.rank.WorkerID == id {
				rs.down = down
			}
		}
		p.mu.Unlock()
	}
	if down {
		h.catalog.index.RemoveWorker(key, id)
	}
}

// healthURL is the probe URL of an endpoint: its host:port (any path
// dropped) with /health, over https only when the endpoint says so.
func healthURL(endpoint string) string {
	scheme := "http"
	if len(endpoint) >= 8 && strings.EqualFold(endpoint[:8], "https://") {
		scheme = "https"
	}
	host, _, _ := strings.Cut(HostPort(endpoint), "/")
	return (&url.URL{Scheme: scheme, Host: host, Path: "/health"}).String()
}

// probeHealthy reports whether GET /health on endpoint, with header,
// answers 2xx within timeout. It reads at most probeMaxBody bytes of the
// answer.
func probeHealthy(endpoint string, timeout time.Duration, header http.Header) bool {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, healthURL(endpoint), nil)
	if err != nil {
		return false
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.CopyN(io.Discard, resp.Body, probeMaxBody)
	return resp.StatusCode >= 200 && resp.StatusCode < 300
}
