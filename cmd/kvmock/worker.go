package main

import (
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// worker is one simulated vLLM process: an OpenAI-compatible HTTP server
// in front of one engine per DP rank.
type worker struct {
	id      int // 1-based
	cfg     *Config
	engines []*engine
	// adapters are the LoRA adapters this worker loaded, by name.
	adapters map[string]LoraModule
	addr     string // the bound host:port
	srv      *http.Server
	ln       net.Listener
	served   chan struct{} // closed when Serve returns

	nextID   atomic.Uint64 // completion ids
	stopOnce sync.Once
	stopped  atomic.Bool
	// started stamps "created" fields; it is what a new process would have.
	started time.Time
}

// newWorker binds the worker's listener; serving starts with serve.
func newWorker(cfg *Config, id int, engines []*engine) (*worker, error) {
	ln, err := net.Listen("tcp", cfg.httpAddr(id-1))
	if err != nil {
		return nil, err
	}
	w := &worker{
		id:       id,
		cfg:      cfg,
		engines:  engines,
		adapters: cfg.adaptersFor(id),
		addr:     ln.Addr().String(),
		ln:       ln,
		served:   make(chan struct{}),
		started:  time.Now(),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", w.handleCompletions)
	mux.HandleFunc("POST /v1/chat/completions", w.handleChat)
	mux.HandleFunc("POST /tokenize", w.handleTokenize)
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /metrics", w.handleMetrics)
	mux.HandleFunc("GET /v1/models", w.handleModels)
	if cfg.API == APISGLang {
		mux.HandleFunc("POST /generate", w.handleGenerate)
	}
	w.srv = &http.Server{
		Handler: mux,
		// Longer than a gateway keeps an idle connection (Caddy: 2 min).
		// Go's server starts this clock when it accepts a connection, and a
		// gateway's transport may dial one and pool it before sending
		// anything on it; closing it from this side races with the
		// gateway's next use of it, which fails a POST with a broken pipe
		// (a 502 in the 1,024-worker run). The mock listens on loopback.
		ReadHeaderTimeout: 5 * time.Minute,
		// No write timeout: a stream lasts as long as its generation.
	}
	return w, nil
}

// serve serves HTTP until the server is closed.
func (w *worker) serve() {
	defer close(w.served)
	_ = w.srv.Serve(w.ln)
}

// stop closes the HTTP server and every engine (which closes their
// sockets). A stopped worker stays stopped; the fleet can still report it.
func (w *worker) stop() {
	w.stopOnce.Do(func() {
		w.stopped.Store(true)
		_ = w.srv.Close()
		<-w.served
		var wg sync.WaitGroup
		for _, e := range w.engines {
			wg.Go(func() { e.do(cmdStop) })
		}
		wg.Wait()
	})
}

// pickEngine chooses the DP rank for a request: the one the client names in
// X-data-parallel-rank (vLLM's header for external DP routing, which a
// gateway can set from {http.kv_router.dp_rank}), else the least loaded.
func (w *worker) pickEngine(r *http.Request) *engine {
	if v := r.Header.Get("X-Data-Parallel-Rank"); v != "" {
		if i, err := strconv.Atoi(v); err == nil && i >= 0 && i < len(w.engines) {
			return w.engines[i]
		}
	}
	best := w.engines[0]
	for _, e := range w.engines[1:] {
		if e.load() < best.load() {
			best = e
		}
	}
	return best
}
