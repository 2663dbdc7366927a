package caddymodule

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// decisionVar is the caddyhttp variable under which the kv_router handler
// leaves its decision for lb_policy kv_router.
const decisionVar = "kv_router.decision"

// decision is one request's routing: the reservation it holds on a worker,
// and what reverse_proxy has tried. The handler creates it, the selection
// policy moves it on a failed attempt, and the handler's deferred release
// frees it exactly once, whatever way the request ends.
type decision struct {
	router  *selection.Router
	req     *selection.SelectRequest // kept for failover re-selection
	explain bool

	mu       sync.Mutex
	resp     *selection.SelectResponse // nil when no worker was reserved
	tried    []selection.Rank
	attempts int

	prefilled atomic.Bool
	released  atomic.Bool
}

func decisionFrom(r *http.Request) *decision {
	d, _ := caddyhttp.GetVar(r.Context(), decisionVar).(*decision)
	return d
}

// target is the endpoint the request should go to now.
func (d *decision) target() (string, *selection.SelectResponse) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.resp == nil {
		return "", nil
	}
	return selection.HostPort(d.resp.Endpoint), d.resp
}

// failover frees the current reservation, which reverse_proxy could not
// use, and reserves the best worker not tried yet. It returns false when
// none is left.
func (d *decision) failover() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.resp == nil || d.released.Load() {
		return false
	}
	d.tried = append(d.tried, selection.Rank{WorkerID: d.resp.WorkerID, DPRank: d.resp.DPRank})
	d.router.ReportFailure(d.resp.WorkerID)
	_ = d.router.Free(d.resp.SelectionID)
	d.req.SelectionID = ""
	d.req.Placement.ExcludeRanks = d.tried
	resp, err := d.reserve()
	if err != nil {
		d.resp = nil
		return false
	}
	failoversTotal.Inc()
	d.resp = resp
	return true
}

func (d *decision) reserve() (*selection.SelectResponse, error) {
	if d.explain {
		return d.router.SelectAndReserveExplained(d.req)
	}
	return d.router.SelectAndReserve(d.req)
}

// prefillDone marks the end of prefill (the first response byte), once.
func (d *decision) prefillDone() {
	if d.prefilled.Swap(true) {
		return
	}
	if _, resp := d.target(); resp != nil {
		_ = d.router.PrefillComplete(resp.SelectionID)
	}
}

// observeStatus tells the router's health what the worker's answer says
// about it (selection.Router.ReportStatus: 502/503/504 fail it, so a
// worker that answers only 503 is taken out; 429 is a full worker and
// counts neither way).
func (d *decision) observeStatus(status int) {
	if _, resp := d.target(); resp != nil {
		d.router.ReportStatus(resp.WorkerID, status)
	}
}

// upstreamFailed records that the proxy got no answer from the current
// worker (reverse_proxy's own 502, 503 or 504).
func (d *decision) upstreamFailed() {
	if _, resp := d.target(); resp != nil {
		d.router.ReportFailure(resp.WorkerID)
	}
}

// release frees the reservation, exactly once.
func (d *decision) release() {
	if d.released.Swap(true) {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.resp != nil {
		_ = d.router.Free(d.resp.SelectionID)
	}
}

// annotate sets the response headers and placeholders for the current
// worker, before reverse_proxy writes the response.
func (d *decision) annotate(w http.ResponseWriter, r *http.Request) {
	_, resp := d.target()
	if resp == nil {
		return
	}
	worker := strconv.FormatUint(resp.WorkerID, 10)
	cached := strconv.FormatUint(resp.CachedTokens, 10)
	h := w.Header()
	h.Set("X-KVRouter-Worker", worker)
	h.Set("X-KVRouter-Cached-Tokens", cached)
	if d.explain && len(resp.Candidates) > 0 {
		h.Set("X-KVRouter-Explain", explainHeader(resp.Candidates))
	}
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		repl.Set("http.kv_router.worker", worker)
		repl.Set("http.kv_router.dp_rank", strconv.FormatUint(uint64(resp.DPRank), 10))
		repl.Set("http.kv_router.cached_tokens", cached)
		repl.Set("http.kv_router.endpoint", resp.Endpoint)
	}
}

// explainHeader lists the cheapest candidates: worker/rank, cached blocks,
// prefill tokens in flight, active decode blocks, cost.
func explainHeader(cands []selection.Candidate) string {
	sorted := append([]selection.Candidate(nil), cands...)
	// A partial selection sort: only the few cheapest are shown.
	const show = 8
	n := min(show, len(sorted))
	for i := 0; i < n; i++ {
		m := i
		for j := i + 1; j < len(sorted); j++ {
			if sorted[j].Cost < sorted[m].Cost {
				m = j
			}
		}
		sorted[i], sorted[m] = sorted[m], sorted[i]
	}
	var b strings.Builder
	for i, c := range sorted[:n] {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.FormatUint(c.WorkerID, 10))
		b.WriteByte('/')
		b.WriteString(strconv.FormatUint(uint64(c.DPRank), 10))
		b.WriteString(" overlap=")
		b.WriteString(strconv.FormatUint(uint64(c.DeviceBlocks), 10))
		b.WriteString(" prefill=")
		b.WriteString(strconv.FormatUint(c.PrefillTokens, 10))
		b.WriteString(" decode=")
		b.WriteString(strconv.FormatUint(c.DecodeBlocks, 10))
		b.WriteString(" cost=")
		b.WriteString(strconv.FormatFloat(c.Cost, 'f', 1, 64))
	}
	return b.String()
}
