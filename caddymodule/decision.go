package caddymodule

import (
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// decisionVar is the caddyhttp variable under which the kv_router handler
// leaves its decision for lb_policy kv_router.
const decisionVar = "kv_router.decision"

// decision is one request's routing, as lb_policy kv_router sees it: the
// reservation the handler made (selection.Reservation keeps its lifecycle:
// failovers, prefill, release, each once) and how many upstreams
// reverse_proxy has asked for.
type decision struct {
	res     *selection.Reservation
	explain bool
	// attempts counts the policy's Select calls for the request; past the
	// first, reverse_proxy is retrying because an attempt failed.
	attempts atomic.Int32
}

func decisionFrom(r *http.Request) *decision {
	d, _ := caddyhttp.GetVar(r.Context(), decisionVar).(*decision)
	return d
}

// retrying counts an attempt and reports whether one came before it.
func (d *decision) retrying() bool { return d.attempts.Add(1) > 1 }

// failover gives up the current worker, which reverse_proxy could not use,
// for the best one not tried yet; false when none is left.
func (d *decision) failover() bool {
	if !d.res.Failed() {
		return false
	}
	failoversTotal.Inc()
	return true
}

// annotate sets the response headers and placeholders for the current
// worker, before reverse_proxy writes the response.
func (d *decision) annotate(w http.ResponseWriter, r *http.Request) {
	resp := d.res.Response()
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
