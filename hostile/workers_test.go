package hostile

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Workers: HTTP servers on 127.0.0.1 that answer as vLLM's OpenAI server
// does, each with a ZMQ publisher for its KV events, plus the two broken
// kinds the attacks need.

type workerMode int

const (
	vllm        workerMode = iota
	only503                // answers 503 to everything, as an engine stuck in overload or a dead backend behind a sidecar
	hangHeaders            // takes completions and never sends headers, as a wedged engine
)

type worker struct {
	id   uint64
	mode workerMode
	srv  *httptest.Server
	addr string // host:port, the catalog endpoint
	pub  *publisher

	// completions counts requests to /v1/... (any model, any answer):
	// what reached the worker, whatever it did with it.
	completions atomic.Int64
	quit        chan struct{}
	killOnce    sync.Once
}

// startWorker starts a worker and its publisher; t's cleanup kills both.
func startWorker(t *testing.T, id uint64, mode workerMode) *worker {
	t.Helper()
	w := &worker{id: id, mode: mode, quit: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/completions", w.complete)
	mux.HandleFunc("/v1/chat/completions", w.complete)
	mux.HandleFunc("/tokenize", w.tokenize)
	mux.HandleFunc("/health", func(rw http.ResponseWriter, r *http.Request) {})
	w.srv = httptest.NewServer(w.gate(mux))
	w.addr = strings.TrimPrefix(w.srv.URL, "http://")
	w.pub = newPublisher(t, 0) // unbounded: a flood must arrive whole
	t.Cleanup(w.kill)
	return w
}

// record is the worker's full registration.
func (w *worker) record() map[string]any { return workerRecord(w.id, w.addr, w.pub.ep) }

// kill stops the worker abruptly, as kill -9 would: its connections are
// cut, its port refuses, its publisher is gone.
func (w *worker) kill() {
	w.killOnce.Do(func() {
		close(w.quit)
		w.srv.CloseClientConnections()
		w.srv.Close()
		w.pub.close()
	})
}

// gate applies the worker's mode before vLLM's routes.
func (w *worker) gate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		// Completions only: the gateway's engine-facts reader asks every
		// worker GET /v1/models, and that is not a routed request.
		if r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/") {
			w.completions.Add(1)
		}
		if w.mode == only503 {
			_, _ = io.Copy(io.Discard, r.Body)
			vllmError(rw, http.StatusServiceUnavailable, "ServiceUnavailableError", "The engine is overloaded.")
			return
		}
		next.ServeHTTP(rw, r)
	})
}

// vllmError answers in vLLM's error shape.
func vllmError(rw http.ResponseWriter, code int, typ, msg string) {
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(code)
	_ = json.NewEncoder(rw).Encode(map[string]any{"error": map[string]any{
		"message": msg, "type": typ, "param": nil, "code": code}})
}

// complete is vLLM's /v1/completions and /v1/chat/completions: a model it
// does not serve is a 404; otherwise a short answer, as JSON or SSE.
func (w *worker) complete(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		vllmError(rw, http.StatusMethodNotAllowed, "BadRequestError", "Method Not Allowed")
		return
	}
	var req struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		vllmError(rw, http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	if w.mode == hangHeaders {
		select { // until the gateway gives up on us, or the test ends
		case <-r.Context().Done():
		case <-w.quit:
		}
		return
	}
	if req.Model != model {
		vllmError(rw, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return
	}
	id := fmt.Sprintf("cmpl-%d-%d", w.id, w.completions.Load())
	if !req.Stream {
		rw.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(rw, `{"id":%q,"object":"text_completion","model":%q,"choices":[{"index":0,"text":"ok","finish_reason":"length"}],`+
			`"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}`, id, model)
		return
	}
	rw.Header().Set("Content-Type", "text/event-stream")
	for _, text := range []string{"o", "k"} {
		fmt.Fprintf(rw, "data: {\"id\":%q,\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":%q}]}\n\n", id, text)
		rw.(http.Flusher).Flush()
	}
	fmt.Fprint(rw, "data: [DONE]\n\n")
}

// tokenize is vLLM's /tokenize: one token per byte of the text.
func (w *worker) tokenize(rw http.ResponseWriter, r *http.Request) {
	var req struct {
		Prompt   string `json:"prompt"`
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		vllmError(rw, http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	text := req.Prompt
	for _, m := range req.Messages {
		text += m.Content
	}
	toks := make([]int, len(text))
	for i := range len(text) {
		toks[i] = int(text[i])
	}
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(map[string]any{"count": len(toks), "max_model_len": 32768, "tokens": toks})
}
