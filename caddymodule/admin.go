package caddymodule

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"

	"github.com/caddyserver/caddy/v2"

	"github.com/kvrouter/caddy-kvrouter/indexer"
	"github.com/kvrouter/caddy-kvrouter/selection"
)

func init() {
	caddy.RegisterModule(Admin{})
}

// Admin serves the kv_router state on Caddy's admin listener:
// GET /kv_router/workers lists the catalog with each rank's load and
// indexed blocks, GET /kv_router/stats reports the router's and the
// KV-event listeners' counters, and GET /kv_router/instance answers the
// process's random id (how the catalog tells that a worker endpoint is this
// admin listener). Both read the running router, so they
// answer the same across reloads.
type Admin struct{}

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.kv_router",
		New: func() caddy.Module { return new(Admin) },
	}
}

// Routes returns the admin routes.
func (a Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/kv_router/workers", Handler: caddy.AdminHandlerFunc(a.workers)},
		{Pattern: "/kv_router/stats", Handler: caddy.AdminHandlerFunc(a.stats)},
		{Pattern: instancePath, Handler: caddy.AdminHandlerFunc(a.instance)},
	}
}

// instance answers this process's id, by which the catalog recognizes a
// worker endpoint that is this admin listener (selfguard.go).
func (Admin) instance(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("method not allowed")}
	}
	return writeAdminJSON(w, instanceAnswer{Instance: instanceID})
}

// runningState is the pooled router state, or nil when no config has a
// kv_router app.
func runningState() *routerState {
	var state *routerState
	routers.Range(func(_, v any) bool {
		state, _ = v.(*routerState)
		return false
	})
	return state
}

var errNoRouter = caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("no kv_router app is running")}

// adminWorker is one worker in GET /kv_router/workers.
type adminWorker struct {
	selection.WorkerRecord
	Ranks []adminRank `json:"ranks"`
	// KVEvents are the KV-event counters its publishers raised, the
	// nonzero ones under /kv_router/stats' keys, so that an operator can
	// tell which worker sends malformed payloads, falls behind or
	// restarts; absent when all are zero.
	KVEvents map[string]uint64 `json:"kv_events,omitempty"`
	// TakenOut is set while the worker is out of the candidates for
	// failing (worker_down_after), here or on another replica's word;
	// its lifecycle still reads schedulable.
	TakenOut bool `json:"taken_out,omitempty"`
}

// nonzeroEvents returns c's nonzero counters by their stats keys, or nil.
func nonzeroEvents(c indexer.EventCounts) map[string]uint64 {
	var out map[string]uint64
	s := indexer.Snapshot{Events: c}
	for _, f := range indexer.Figures {
		if f.Section != indexer.SectionEvents || f.Gauge {
			continue
		}
		if v := f.Value(&s); v != 0 {
			if out == nil {
				out = map[string]uint64{}
			}
			out[f.Key] = v
		}
	}
	return out
}

type adminRank struct {
	DPRank         uint32 `json:"dp_rank"`
	PrefillTokens  uint64 `json:"active_prefill_tokens"`
	DecodeBlocks   uint64 `json:"active_decode_blocks"`
	ActiveRequests uint64 `json:"active_requests"`
	IndexedBlocks  int    `json:"indexed_blocks"`
}

func (Admin) workers(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("method not allowed")}
	}
	state := runningState()
	if state == nil {
		return errNoRouter
	}
	loads := map[selection.Rank]selection.PotentialLoad{}
	for _, m := range state.router.Queries().Loads("", "") {
		for _, l := range m.Loads {
			loads[selection.Rank{WorkerID: l.WorkerID, DPRank: l.DPRank}] = l
		}
	}
	recs := state.router.Catalog().ListWorkers("", "")
	var counts map[uint64]indexer.EventCounts
	if state.events != nil {
		counts = state.events.WorkerCounts()
	}
	out := make([]adminWorker, 0, len(recs))
	takenOut := state.router.Health().TakenOut()
	for _, rec := range recs {
		aw := adminWorker{WorkerRecord: rec, Ranks: []adminRank{}, KVEvents: nonzeroEvents(counts[rec.WorkerID]),
			TakenOut: slices.Contains(takenOut, rec.WorkerID)}
		for _, rk := range rec.Ranks() {
			l := loads[rk]
			ar := adminRank{DPRank: rk.DPRank, PrefillTokens: l.PotentialPrefillTokens, DecodeBlocks: l.PotentialDecodeBlocks,
				ActiveRequests: l.ActiveRequests}
			if state.events != nil {
				ar.IndexedBlocks = state.events.Index.Blocks(rec.Partition(), rk)
			}
			aw.Ranks = append(aw.Ranks, ar)
		}
		out = append(out, aw)
	}
	return writeAdminJSON(w, out)
}

// stats answers GET /kv_router/stats: the catalog's and reservations'
// figures and, in event mode, the KV-event listeners' and the index's.
func (Admin) stats(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("method not allowed")}
	}
	state := runningState()
	if state == nil {
		return errNoRouter
	}
	ready := state.router.Catalog().Ready()
	out := map[string]any{
		"workers":             len(ready.Workers),
		"schedulable_workers": ready.SchedulableWorkers,
		// Workers out of the candidates for failing, though schedulable.
		"taken_out_workers":   len(state.router.Health().TakenOut()),
		"active_reservations": state.router.ActiveReservations(),
		"use_kv_events":       state.events != nil,
		// What the gateway predicted against what the engines reported
		// (accountability.go), per model, since the process started.
		"predictions": predictions.snapshot(),
		"tokenize_cache": map[string]uint64{
			"hits": tokenizeCacheHits.Load(), "misses": tokenizeCacheMisses.Load(),
		},
	}
	if m := state.events; m != nil {
		for name, sec := range statsSections(m.Stats()) {
			out[name] = sec
		}
	}
	return writeAdminJSON(w, out)
}

// statsSections renders a snapshot as the kv_events and index objects of
// /kv_router/stats, from the same table as the kvrouter_* metrics.
func statsSections(snap indexer.Snapshot) map[string]map[string]uint64 {
	out := map[string]map[string]uint64{}
	for _, f := range indexer.Figures {
		if out[f.Section] == nil {
			out[f.Section] = map[string]uint64{}
		}
		out[f.Section][f.Key] = f.Value(&snap)
	}
	return out
}

func writeAdminJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(v)
}

// Interface guard
var _ caddy.AdminRouter = Admin{}
