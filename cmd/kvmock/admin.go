package main

import (
	"net/http"
	"strconv"
	"sync"

	json "github.com/goccy/go-json"
)

// The fleet admin API, for benchmarks and demos that need to put workers
// into known states:
//
//	POST /reset                        every worker drops its cache and
//	                                   announces AllBlocksCleared
//	POST /workers/{id}/restart         the worker behaves like a new process
//	POST /workers/{id}/drop_events?n=K the next K batches are lost on the wire
//	POST /workers/{id}/stop            the worker stops serving for good
//	GET  /stats                        counters per worker and in total
//
// Actions on a worker apply to all its DP ranks unless ?rank=R names one.

// adminHandler routes the admin API.
func (f *Fleet) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /reset", f.adminReset)
	mux.HandleFunc("POST /workers/{id}/restart", f.adminRestart)
	mux.HandleFunc("POST /workers/{id}/drop_events", f.adminDropEvents)
	mux.HandleFunc("POST /workers/{id}/stop", f.adminStop)
	mux.HandleFunc("GET /stats", f.adminStats)
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	return mux
}

// writeJSON answers with v as JSON.
func writeJSON(rw http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(rw, err.Error(), http.StatusInternalServerError)
		return
	}
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(status)
	_, _ = rw.Write(append(b, '\n'))
}

// adminError answers {"error": msg}, as the selection API does.
func adminError(rw http.ResponseWriter, status int, msg string) {
	writeJSON(rw, status, map[string]string{"error": msg})
}

// adminReset clears every running worker's cache, all at once: each
// engine waits for its current step to end, and doing them one after the
// other would add up those waits.
func (f *Fleet) adminReset(rw http.ResponseWriter, _ *http.Request) {
	var wg sync.WaitGroup
	n := 0
	for _, w := range f.workers {
		if w.stopped.Load() {
			continue
		}
		n++
		for _, e := range w.engines {
			wg.Go(func() { e.do(cmdReset) })
		}
	}
	wg.Wait()
	writeJSON(rw, http.StatusOK, map[string]int{"reset_workers": n})
}

// target resolves {id} and the optional rank to a live worker's engines.
func (f *Fleet) target(rw http.ResponseWriter, r *http.Request) (*worker, []*engine, bool) {
	id, err := strconv.Atoi(r.PathValue("id"))
	if err != nil {
		adminError(rw, http.StatusBadRequest, "worker id must be an integer")
		return nil, nil, false
	}
	w, err := f.worker(id)
	if err != nil {
		adminError(rw, http.StatusNotFound, err.Error())
		return nil, nil, false
	}
	if w.stopped.Load() {
		adminError(rw, http.StatusConflict, "worker is stopped")
		return nil, nil, false
	}
	engines := w.engines
	if v := r.URL.Query().Get("rank"); v != "" {
		rank, err := strconv.Atoi(v)
		if err != nil || rank < 0 || rank >= len(w.engines) {
			adminError(rw, http.StatusBadRequest, "no such rank")
			return nil, nil, false
		}
		engines = w.engines[rank : rank+1]
	}
	return w, engines, true
}

// adminRestart restarts a worker like a new vLLM process: its requests
// fail, its cache is empty and its publisher starts again at sequence 0
// with an empty replay buffer. Nothing is announced; the gateway has to
// notice the sequence going back.
func (f *Fleet) adminRestart(rw http.ResponseWriter, r *http.Request) {
	w, engines, ok := f.target(rw, r)
	if !ok {
		return
	}
	var wg sync.WaitGroup
	for _, e := range engines {
		wg.Go(func() { e.do(cmdRestart) })
	}
	wg.Wait()
	writeJSON(rw, http.StatusOK, map[string]int{"restarted": w.id})
}

// adminDropEvents makes the next n batches of each targeted rank go
// unsent (they are still buffered for replay), so a gateway sees a gap.
func (f *Fleet) adminDropEvents(rw http.ResponseWriter, r *http.Request) {
	w, engines, ok := f.target(rw, r)
	if !ok {
		return
	}
	n, err := strconv.Atoi(r.URL.Query().Get("n"))
	if err != nil || n < 0 {
		adminError(rw, http.StatusBadRequest, "n must be a non-negative integer")
		return
	}
	for _, e := range engines {
		e.pub.dropNext(n)
	}
	writeJSON(rw, http.StatusOK, map[string]int{"worker_id": w.id, "drop_next": n})
}

// adminStop stops a worker: it closes its HTTP server and its sockets.
func (f *Fleet) adminStop(rw http.ResponseWriter, r *http.Request) {
	w, _, ok := f.target(rw, r)
	if !ok {
		return
	}
	w.stop()
	writeJSON(rw, http.StatusOK, map[string]int{"stopped": w.id})
}

// rankStats are one engine's counters.
type rankStats struct {
	DPRank           int    `json:"dp_rank"`
	KVEventsEndpoint string `json:"kv_events_endpoint"`
	ReplayEndpoint   string `json:"replay_endpoint"`
	RequestsServed   int64  `json:"requests_served"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CachedTokens     int64  `json:"cached_tokens"`
	GeneratedTokens  int64  `json:"generated_tokens"`
	Evictions        int64  `json:"evictions"`
	BatchesPublished int64  `json:"batches_published"`
	BatchesDropped   int64  `json:"batches_dropped"`
	EventsPublished  int64  `json:"events_published"`
	// Subscriptions is how many topics subscribers hold on the rank's
	// KV-event socket (a gateway subscribes to one, "").
	Subscriptions int64   `json:"subscriptions"`
	NextSeq       uint64  `json:"next_seq"`
	Running       int64   `json:"running"`
	Waiting       int64   `json:"waiting"`
	CachedBlocks  int64   `json:"cached_blocks"`
	KVCacheUsage  float64 `json:"kv_cache_usage"`
}

// workerStats sums a worker's ranks; usage is their mean.
type workerStats struct {
	WorkerID int    `json:"worker_id"`
	Endpoint string `json:"endpoint"`
	Stopped  bool   `json:"stopped"`
	rankStats
	Ranks []rankStats `json:"ranks"`
}

// fleetStats is the answer of GET /stats.
type fleetStats struct {
	Workers []workerStats `json:"workers"`
	Totals  rankStats     `json:"totals"`
	// CacheHitRate is cached_tokens / prompt_tokens over the fleet.
	CacheHitRate float64 `json:"cache_hit_rate"`
	// Ranks counts the fleet's engines and SubscribedRanks those whose
	// KV-event socket has a subscriber: when they are equal, nothing the
	// fleet publishes from now on is lost to a slow-joining subscriber.
	Ranks           int `json:"ranks"`
	SubscribedRanks int `json:"subscribed_ranks"`
}

// snapshot reads an engine's counters; they are atomics, so it needs no
// help from the scheduler goroutine and never waits for a step.
func (e *engine) snapshot() rankStats {
	return rankStats{
		DPRank:           e.dpRank,
		KVEventsEndpoint: e.pub.PubEndpoint,
		ReplayEndpoint:   e.pub.ReplayEndpoint,
		RequestsServed:   e.stats.served.Load(),
		PromptTokens:     e.stats.promptTokens.Load(),
		CachedTokens:     e.stats.cachedTokens.Load(),
		GeneratedTokens:  e.stats.genTokens.Load(),
		Evictions:        e.stats.evictions.Load(),
		BatchesPublished: e.pub.batches.Load(),
		BatchesDropped:   e.pub.dropped.Load(),
		EventsPublished:  e.pub.events.Load(),
		Subscriptions:    e.pub.subs.Load(),
		NextSeq:          e.pub.nextSeq(),
		Running:          e.stats.running.Load(),
		Waiting:          e.stats.waiting.Load(),
		CachedBlocks:     e.stats.cachedBlocks.Load(),
		KVCacheUsage:     e.usage(),
	}
}

// add accumulates the counters of o (endpoints and sequence excepted).
func (s *rankStats) add(o rankStats) {
	s.RequestsServed += o.RequestsServed
	s.PromptTokens += o.PromptTokens
	s.CachedTokens += o.CachedTokens
	s.GeneratedTokens += o.GeneratedTokens
	s.Evictions += o.Evictions
	s.BatchesPublished += o.BatchesPublished
	s.BatchesDropped += o.BatchesDropped
	s.EventsPublished += o.EventsPublished
	s.Subscriptions += o.Subscriptions
	s.Running += o.Running
	s.Waiting += o.Waiting
	s.CachedBlocks += o.CachedBlocks
	s.KVCacheUsage += o.KVCacheUsage
}

// stats gathers every worker's counters and the fleet totals.
func (f *Fleet) stats() fleetStats {
	f.pub.refreshSubs()
	var out fleetStats
	out.Workers = make([]workerStats, 0, len(f.workers))
	nranks := 0
	for _, w := range f.workers {
		ws := workerStats{WorkerID: w.id, Endpoint: w.addr, Stopped: w.stopped.Load()}
		for _, e := range w.engines {
			rs := e.snapshot()
			ws.Ranks = append(ws.Ranks, rs)
			ws.add(rs)
			nranks++
			if rs.Subscriptions > 0 {
				out.SubscribedRanks++
			}
		}
		ws.KVEventsEndpoint, ws.ReplayEndpoint = ws.Ranks[0].KVEventsEndpoint, ws.Ranks[0].ReplayEndpoint
		ws.NextSeq = ws.Ranks[0].NextSeq
		out.Totals.add(ws.rankStats)
		ws.KVCacheUsage /= float64(len(w.engines))
		out.Workers = append(out.Workers, ws)
	}
	out.Ranks = nranks
	out.Totals.KVCacheUsage /= float64(nranks)
	if out.Totals.PromptTokens > 0 {
		out.CacheHitRate = float64(out.Totals.CachedTokens) / float64(out.Totals.PromptTokens)
	}
	return out
}

// adminStats answers GET /stats.
func (f *Fleet) adminStats(rw http.ResponseWriter, _ *http.Request) {
	writeJSON(rw, http.StatusOK, f.stats())
}
