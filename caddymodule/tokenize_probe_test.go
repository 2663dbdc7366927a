package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// countingTokenizer is a worker of model "m" whose /tokenize answers three
// tokens, counting its calls and keeping the last call's headers.
func countingTokenizer(t *testing.T) (*selection.Router, *atomic.Int64, *atomic.Value) {
	t.Helper()
	var calls atomic.Int64
	var hdr atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		hdr.Store(r.Header.Clone())
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"count":3,"max_model_len":1000,"tokens":[1,2,3]}`))
	}))
	t.Cleanup(srv.Close)
	id, model, ep, bs := uint64(1), "m", srv.Listener.Addr().String(), uint32(16)
	router := routerWith(t, nil, selection.WorkerRequest{WorkerID: &id, ModelName: &model, Endpoint: &ep, BlockSize: &bs})
	return router, &calls, &hdr
}

// tokensOf runs the handler's tokens for body on path.
func tokensOf(t *testing.T, h *Handler, path, body string) []uint32 {
	t.Helper()
	var o openAIRequest
	if err := selection.DecodeJSON([]byte(body), &o); err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, path, nil)
	part := selection.Partition{ModelName: "m"}
	toks, _ := h.tokens(r, &o, part.Key(), "")
	return toks
}

// TestTokenizeCacheKeptPerSalt: two tenants' salted requests for the same
// conversation each ask /tokenize: the second is not answered from the
// first's entry, which made it measurably faster and told its tenant the
// conversation had been sent. The same salt is answered from the cache.
func TestTokenizeCacheKeptPerSalt(t *testing.T) {
	router, calls, _ := countingTokenizer(t)
	h := &Handler{router: router, tokenizer: newTokenizer(router, 2*time.Second, 4<<20)}
	for _, salt := range []string{"tenant-a", "tenant-b", "tenant-a"} {
		body := `{"model":"m","messages":[{"role":"user","content":"secret"}],"cache_salt":"` + salt + `"}`
		if toks := tokensOf(t, h, "/v1/chat/completions", body); len(toks) != 3 {
			t.Fatalf("tokens %v", toks)
		}
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("/tokenize asked %d times for two tenants' three requests, want 2", n)
	}
}

// TestTokenizeCallIsMarked: the gateway's own /tokenize call carries this
// process's mark, so that a worker whose endpoint is the gateway refuses
// it at once (it came back as a request to tokenize, which called again:
// a probe saw 4 completions make some 3,800 nested calls).
func TestTokenizeCallIsMarked(t *testing.T) {
	router, _, hdr := countingTokenizer(t)
	h := &Handler{router: router, tokenizer: newTokenizer(router, 2*time.Second, 0)}
	if toks := tokensOf(t, h, "/v1/completions", `{"model":"m","prompt":"x"}`); len(toks) != 3 {
		t.Fatalf("tokens %v", toks)
	}
	if got, _ := hdr.Load().(http.Header); got.Get(viaHeader) != processID {
		t.Errorf("the /tokenize call carries %s %q, want this process's id", viaHeader, got.Get(viaHeader))
	}
}

// TestLoopGuardCoversEveryMethod: a request that comes back with this
// process's mark is refused whatever its method (a GET that came back was
// passed on, round and round until a header grew too large).
func TestLoopGuardCoversEveryMethod(t *testing.T) {
	h := &Handler{logger: zap.NewNop()}
	for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
		r := httptest.NewRequest(method, "/v1/anything", nil)
		r.Header.Set(viaHeader, processID)
		w := httptest.NewRecorder()
		passed := false
		next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { passed = true; return nil })
		_ = h.ServeHTTP(w, r, next)
		if passed || w.Code != http.StatusLoopDetected {
			t.Errorf("%s that came back: passed on %v, status %d; want 508", method, passed, w.Code)
		}
	}
}

// TestTokenizeAnswerBoundedByContext: with the model's context length
// known, a prompt tokenized past it is routed by load (the engine refuses
// it), and an answer longer than that many tokens can take is not read
// whole; within it, the tokens are used.
func TestTokenizeAnswerBoundedByContext(t *testing.T) {
	var answer atomic.Int32 // 0: three tokens; 1: 100,000 long ids; 2: 5,000 short ones
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		b := []byte(`{"tokens":[1`)
		switch answer.Load() {
		case 0:
			b = append(b, ",2,3"...)
		case 1: // some 700 KB: past what 4,096 tokens take
			for range 99_999 {
				b = append(b, ",123456"...)
			}
		case 2: // within the byte bound, past the count
			for range 4_999 {
				b = append(b, ",7"...)
			}
		}
		_, _ = w.Write(append(b, "]}"...))
	}))
	defer srv.Close()
	id, model, ep, bs, maxLen := uint64(1), "m", srv.Listener.Addr().String(), uint32(16), uint64(4096)
	router := routerWith(t, nil, selection.WorkerRequest{WorkerID: &id, ModelName: &model, Endpoint: &ep,
		BlockSize: &bs, MaxModelLen: &maxLen})
	h := &Handler{router: router, tokenizer: newTokenizer(router, 2*time.Second, 0), logger: zap.NewNop()}
	if toks := tokensOf(t, h, "/v1/completions", `{"model":"m","prompt":"short"}`); len(toks) != 3 {
		t.Fatalf("a prompt within the context: tokens %v", toks)
	}
	// Such a prompt is over every context: counted so, as a prompt of ids
	// is, not as a failure to tokenize.
	over := contextFiltered.WithLabelValues("m", "over")
	for mode, what := range map[int32]string{1: "100,000 tokens", 2: "5,000 tokens"} {
		answer.Store(mode)
		o0, f0 := testCounter(over), testCounter(tokenizeFailures)
		if toks := tokensOf(t, h, "/v1/completions", `{"model":"m","prompt":"long"}`); toks != nil {
			t.Errorf("%s against a context of 4,096 routed by %d tokens", what, len(toks))
		}
		if do, df := testCounter(over)-o0, testCounter(tokenizeFailures)-f0; do != 1 || df != 0 {
			t.Errorf("%s against a context of 4,096: counted %v over and %v tokenize failures, want 1 and 0", what, do, df)
		}
	}
	// With a second worker of a longer context, the 5,000 tokens fit it:
	// the answer is read (the context filter then sends the request
	// there), where the shortest context had bounded it.
	id2, longer := uint64(2), uint64(65536)
	if _, err := router.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: &id2, ModelName: &model, Endpoint: &ep,
		BlockSize: &bs, MaxModelLen: &longer}); err != nil {
		t.Fatal(err)
	}
	answer.Store(2)
	if toks := tokensOf(t, h, "/v1/completions", `{"model":"m","prompt":"long too"}`); len(toks) != 5000 {
		t.Errorf("5,000 tokens with a worker of 65,536: read %d, want 5000", len(toks))
	}
	// With a worker whose context is unknown, no prompt is past every
	// context: the 100,000 tokens are read (it used to be cut at the
	// longest context reported, and the request routed by load).
	id3 := uint64(3)
	if _, err := router.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: &id3, ModelName: &model, Endpoint: &ep,
		BlockSize: &bs}); err != nil {
		t.Fatal(err)
	}
	answer.Store(1)
	if toks := tokensOf(t, h, "/v1/completions", `{"model":"m","prompt":"longer still"}`); len(toks) != 100_000 {
		t.Errorf("100,000 tokens with a worker of unknown context: read %d, want 100000", len(toks))
	}
}

// TestHealthProbeIsMarked: the router the gateway builds sends its health
// probes (GET /health on a worker taken out) with this process's mark, as
// every other call it makes, so a worker whose endpoint is the gateway
// refuses the probe at once rather than passing it on once.
func TestHealthProbeIsMarked(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			got.Store(r.Header.Get(viaHeader))
		}
	}))
	defer srv.Close()
	cfg := selection.DefaultConfig()
	cfg.UseKVEvents, cfg.WorkerDownAfter = false, 20*time.Millisecond
	s, err := newRouterState(cfg, eventSettings{}, (&Limits{}).events(0), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Destruct() }()
	id, ep, bs := uint64(1), srv.Listener.Addr().String(), uint32(16)
	if _, err := s.router.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: &id, Endpoint: &ep, BlockSize: &bs}); err != nil {
		t.Fatal(err)
	}
	s.router.Health().ReportFailure(id)
	for deadline := time.Now().Add(5 * time.Second); got.Load() == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the worker was never probed")
		}
		s.router.Sweep()
	}
	if v := got.Load().(string); v != processID {
		t.Fatalf("the probe carried %s %q, want this process's id", viaHeader, v)
	}
}

// BenchmarkTokenizeWorkers: the workers a /tokenize call may ask, at
// 1,024 workers of the model, as a request whose answer is not cached
// finds them.
func BenchmarkTokenizeWorkers(b *testing.B) {
	var workers []selection.WorkerRequest
	for id := uint64(1); id <= 1024; id++ {
		workers = append(workers, contextWorker(id, 4096<<(id%2)))
	}
	router := routerWith(b, nil, workers...)
	tk := newTokenizer(router, time.Second, 0)
	part := selection.PartitionKey{Model: "m"}
	b.ReportAllocs()
	for b.Loop() {
		if pc := tk.workers.of(part, ""); len(pc.tokenizers) != 1024 || pc.tokenizeLimit != 8192 {
			b.Fatal(len(pc.tokenizers), pc.tokenizeLimit)
		}
	}
}

// tokenizeWorker is a worker of model "m" whose /tokenize is h, its
// server set up by configure (when given) before it starts.
func tokenizeWorker(t *testing.T, h http.Handler, configure ...func(*http.Server)) (*selection.Router, *httptest.Server) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	for _, c := range configure {
		c(srv.Config)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	id, model, ep, bs := uint64(1), "m", srv.Listener.Addr().String(), uint32(16)
	return routerWith(t, nil, selection.WorkerRequest{WorkerID: &id, ModelName: &model, Endpoint: &ep, BlockSize: &bs}), srv
}

// TestTokenizeFollowsNoRedirect: a worker that answers /tokenize with a
// redirect is not followed: the prompt is not re-sent wherever it points
// (Go's client followed a 307 with the body, to any address).
func TestTokenizeFollowsNoRedirect(t *testing.T) {
	var elsewhere atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		_, _ = w.Write([]byte(`{"tokens":[1,2,3]}`))
	}))
	t.Cleanup(other.Close)
	router, _ := tokenizeWorker(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/tokenize", http.StatusTemporaryRedirect)
	}))
	h := &Handler{router: router, tokenizer: newTokenizer(router, 2*time.Second, 0), logger: zap.NewNop()}
	if toks := tokensOf(t, h, "/v1/completions", `{"model":"m","prompt":"secret"}`); toks != nil {
		t.Errorf("tokens %v from a redirect, want none", toks)
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the redirect was followed: %d requests elsewhere", n)
	}
}

// TestTokenizerClosesItsConnections: the handler's cleanup closes the
// tokenizer's idle connections to the workers. On Go's shared transport
// they stayed open for its 90 s idle timeout after the config that made
// them was unloaded.
func TestTokenizerClosesItsConnections(t *testing.T) {
	var open atomic.Int64
	router, _ := tokenizeWorker(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"tokens":[1,2,3]}`))
	}), func(srv *http.Server) {
		srv.ConnState = func(_ net.Conn, s http.ConnState) {
			switch s {
			case http.StateNew:
				open.Add(1)
			case http.StateClosed, http.StateHijacked:
				open.Add(-1)
			}
		}
	})
	h := &Handler{router: router, tokenizer: newTokenizer(router, 2*time.Second, 0)}
	if toks := tokensOf(t, h, "/v1/completions", `{"model":"m","prompt":"x"}`); len(toks) != 3 {
		t.Fatalf("tokens %v", toks)
	}
	if n := open.Load(); n != 1 {
		t.Fatalf("%d connections open after a tokenize, want the one kept", n)
	}
	if err := h.Cleanup(); err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); open.Load() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("%d connections still open 5 s after the handler's cleanup", open.Load())
		}
	}
}

// TestTokenizeAnswerBoundedByThePrompt: with no context known, a
// /tokenize answer is read only as far as the prompt can make tokens
// (a token a byte, and the template's): a worker answering a short prompt
// with 4 million ids is refused, and not as a prompt past the context. A
// worker that reported no context had every answer read up to 64 MiB,
// and the gateway grew to 3 GB under eight clients.
func TestTokenizeAnswerBoundedByThePrompt(t *testing.T) {
	huge := []byte(`{"tokens":[` + strings.Repeat("1,", 4<<20) + `1]}`)
	router, _ := tokenizeWorker(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(huge)
	}))
	tk := newTokenizer(router, 5*time.Second, 0)
	toks, err := tk.tokenize(context.Background(), selection.PartitionKey{Model: "m"}, "", []byte(`{"model":"m","prompt":"hello"}`), false)
	if toks != nil || err == nil || errors.Is(err, errPastContext) || !strings.Contains(err.Error(), "past what the prompt can make") {
		t.Fatalf("%d tokens, error %v; want the answer refused as past what the prompt can make", len(toks), err)
	}
}

// TestTokenizeSkipsASilentWorkerForAWhile: a worker whose /tokenize does
// not answer within the time is asked after the others for a while.
// Taking turns with the good ones, it took one request in two their whole
// tokenize_timeout (all of a request's tries share it) and their prefix
// routing.
func TestTokenizeSkipsASilentWorkerForAWhile(t *testing.T) {
	silent, silentCalls := silentServer(t)
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"tokens":[1,2,3]}`))
	}))
	t.Cleanup(good.Close)
	ids, model, bs := []uint64{1, 2}, "m", uint32(16)
	eps := []string{silent.Listener.Addr().String(), good.Listener.Addr().String()}
	router := routerWith(t, nil,
		selection.WorkerRequest{WorkerID: &ids[0], ModelName: &model, Endpoint: &eps[0], BlockSize: &bs},
		selection.WorkerRequest{WorkerID: &ids[1], ModelName: &model, Endpoint: &eps[1], BlockSize: &bs})
	tk := newTokenizer(router, 300*time.Millisecond, 0)
	answered := 0
	for range 8 {
		toks, _ := tk.tokenize(context.Background(), selection.PartitionKey{Model: "m"}, "", []byte(`{"model":"m","prompt":"x"}`), false)
		if len(toks) == 3 {
			answered++
		}
	}
	if n := silentCalls.Load(); n != 1 || answered < 7 {
		t.Fatalf("the silent worker was asked %d times, and %d of 8 requests answered; want once, and 7", n, answered)
	}
}

// TestTokenizeBoundAllowsExpandedMedia: vLLM's /tokenize (0.17 on)
// expands each image into its tokens, some thousands named by a short
// URL: an honest answer for 40 images of 16,386 tokens each is read
// whole, where a text request's bound would have refused it.
func TestTokenizeBoundAllowsExpandedMedia(t *testing.T) {
	var parts []string
	for i := range 40 {
		parts = append(parts, fmt.Sprintf(`{"type":"image_url","image_url":{"url":"http://img/%d.png"}}`, i))
	}
	body := []byte(`{"model":"m","messages":[{"role":"user","content":[` + strings.Join(parts, ",") + `]}]}`)
	ids := strings.TrimSuffix(strings.Repeat("151655,", 40*16386), ",")
	router, _ := tokenizeWorker(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"tokens":[`+ids+`]}`)
	}))
	tk := newTokenizer(router, 5*time.Second, 0)
	toks, err := tk.tokenize(context.Background(), selection.PartitionKey{Model: "m"}, "", body, false)
	if err != nil || len(toks) != 40*16386 {
		t.Fatalf("%d tokens, %v; want the expanded images' %d", len(toks), err, 40*16386)
	}
	if n := promptTokensAtMost([]byte(`{"prompt":"hello"}`)); n != 18+templateTokens {
		t.Errorf("a text request's bound: %d tokens", n)
	}
	// Only a chat body's media count: a completion's prompt naming
	// "image_url" 41 times opened the whole 64 MiB.
	prompt := []byte(`{"prompt":[` + strings.TrimSuffix(strings.Repeat(`"image_url",`, 41), ",") + `]}`)
	if n := promptTokensAtMost(prompt); n != int64(len(prompt))+templateTokens {
		t.Errorf("a completion naming image_url: %d tokens", n)
	}
}
