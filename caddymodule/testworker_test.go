package caddymodule

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvrouter/caddy-kvrouter/indexer"
)

// testWorker is a small vLLM stand-in on 127.0.0.1: /v1/completions and
// /v1/chat/completions (JSON or SSE), /tokenize, /v1/models and /metrics
// (its engine, testengine_test.go), and a ZMQ publisher for its KV
// events. Behaviour switches let tests make it slow or fail.
type testWorker struct {
	t         *testing.T
	id        uint64
	srv       *http.Server
	addr      string
	served    atomic.Int64 // completions answered
	tokenized atomic.Int64
	healthHit atomic.Int64 // GET /health requests (the recovery probe)
	// conns is how many connections to the worker are open: the gateway's
	// upstream connections, idle ones included.
	conns atomic.Int64
	// streamDelay is the pause between SSE chunks.
	streamDelay time.Duration
	// hang makes completions wait (after the headers) until the client goes.
	hang atomic.Bool
	// hangBeforeHeaders makes completions wait, sending nothing, until the
	// client goes: a worker stuck before it answers.
	hangBeforeHeaders atomic.Bool
	// chatTemplate makes /tokenize follow vLLM with a chat template that
	// writes its own BOS (vllmtokens_test.go) instead of returning the
	// bare characters.
	chatTemplate bool
	// status, when not zero, is what completions and /health answer
	// (a worker that is overloaded, 429, or broken, 503), with vLLM's
	// error body.
	status atomic.Int32
	// breakMid makes a stream stop mid-way by closing the connection.
	breakMid atomic.Bool
	// gate, when set, holds a stream after its first chunk until closed.
	gate chan struct{}
	// hold, when set, is offered each completion request first (see
	// newH2CTestWorker).
	hold func(http.ResponseWriter, *http.Request) bool
	// engine is what it serves and runs with (testengine_test.go).
	engine testEngine

	zctx  *zmq.Context
	pub   *zmq.Socket
	pubEP string
	seq   uint64
	mu    sync.Mutex
}

func newTestWorker(t *testing.T, id uint64) *testWorker {
	t.Helper()
	return startTestWorker(t, id, nil)
}

// newH2CTestWorker is a test worker that also speaks cleartext HTTP/2 with
// prior knowledge (as vLLM behind an h2c-capable server does), with up to
// streams concurrent streams per connection. hold, when not nil, may take
// over a completion request: it is called first and, when it returns true,
// the request is done.
func newH2CTestWorker(t *testing.T, id uint64, streams int, hold func(http.ResponseWriter, *http.Request) bool) *testWorker {
	t.Helper()
	return startTestWorker(t, id, func(w *testWorker) {
		w.srv.Protocols = new(http.Protocols)
		w.srv.Protocols.SetHTTP1(true)
		w.srv.Protocols.SetUnencryptedHTTP2(true)
		w.srv.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: streams}
		w.hold = hold
	})
}

// startTestWorker starts a worker; setup, when not nil, adjusts it before
// it serves.
func startTestWorker(t *testing.T, id uint64, setup func(*testWorker)) *testWorker {
	t.Helper()
	w := &testWorker{t: t, id: id, streamDelay: 20 * time.Millisecond, engine: defaultTestEngine()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w.addr = ln.Addr().String()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", w.complete)
	mux.HandleFunc("POST /v1/chat/completions", w.complete)
	mux.HandleFunc("POST /tokenize", w.tokenize)
	mux.HandleFunc("GET /health", w.health)
	mux.HandleFunc("GET /v1/models", w.models)
	mux.HandleFunc("GET /metrics", w.metrics)
	w.srv = &http.Server{Handler: mux, ConnState: w.countConns}
	if setup != nil {
		setup(w)
	}
	go func() { _ = w.srv.Serve(ln) }()
	if w.zctx, err = zmq.NewContext(); err != nil {
		t.Fatal(err)
	}
	w.pub, _ = w.zctx.NewSocket(zmq.XPUB)
	_ = w.pub.SetLinger(0)
	_ = w.pub.SetXpubVerbose(1)
	_ = w.pub.SetRcvtimeo(5 * time.Second)
	if err := w.pub.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	w.pubEP, _ = w.pub.GetLastEndpoint()
	t.Cleanup(w.close)
	return w
}

func (w *testWorker) close() {
	_ = w.srv.Close()
	w.pub.Close()
	_ = w.zctx.Term()
}

// countConns is the server's ConnState hook; net/http reports StateNew and
// StateClosed for HTTP/1 and HTTP/2 connections alike.
func (w *testWorker) countConns(_ net.Conn, state http.ConnState) {
	switch state {
	case http.StateNew:
		w.conns.Add(1)
	case http.StateClosed, http.StateHijacked:
		w.conns.Add(-1)
	}
}

// waitNoConns waits until no connection to any of workers is open: the
// gateway has let go of its upstream connections (their keepalive ran out
// or they were closed). A test takes its goroutine and descriptor baseline
// after this rather than after a sleep that hopes the keepalive has run
// out.
func waitNoConns(t *testing.T, workers ...*testWorker) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for _, w := range workers {
		for w.conns.Load() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("worker %d still has %d connections open", w.id, w.conns.Load())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// waitHealthProbes waits until n more GET /health requests than seen
// reached the worker, and returns the new count.
func (w *testWorker) waitHealthProbes(seen int64, n int) int64 {
	w.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got := w.healthHit.Load(); got >= seen+int64(n) {
			return got
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("worker %d: %d health probes, want at least %d", w.id, w.healthHit.Load(), seen+int64(n))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitSubscribed blocks until the gateway subscribed to the events.
func (w *testWorker) waitSubscribed() {
	w.t.Helper()
	if f, err := w.pub.RecvBytes(0); err != nil || len(f) == 0 || f[0] != 1 {
		w.t.Fatalf("worker %d: the gateway never subscribed: %v", w.id, err)
	}
}

// announce publishes a BlockStored for the full blocks of tokens.
func (w *testWorker) announce(tokens []uint32, blockSize int) {
	w.t.Helper()
	w.announceLora(tokens, blockSize, "")
}

// announceLora publishes a BlockStored for the full blocks of tokens
// computed with the LoRA adapter lora ("" for the base model), whose
// name vLLM puts in the event.
func (w *testWorker) announceLora(tokens []uint32, blockSize int, lora string) {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	ev := &indexer.StoredBlocks{BlockSize: blockSize, TokenIDs: tokens[:len(tokens)/blockSize*blockSize], LoraName: lora}
	for b := range len(tokens) / blockSize {
		ev.BlockHashes = append(ev.BlockHashes, w.id<<48|w.seq<<24|uint64(b)+1) // unique per announce
	}
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], w.seq)
	w.seq++
	if _, err := w.pub.SendMessage([]byte{}, s[:], indexer.AppendBatch(nil, indexer.EncodingMap, 1, 0, ev)); err != nil {
		w.t.Fatal(err)
	}
}

// textTokens is the workers' shared tokenizer: one token per byte.
func textTokens(s string) []uint32 {
	out := make([]uint32, len(s))
	for i := range len(s) {
		out[i] = uint32(s[i])
	}
	return out
}

func (w *testWorker) tokenize(rw http.ResponseWriter, r *http.Request) {
	w.tokenized.Add(1)
	if !w.checkModel(rw, r) {
		return
	}
	if w.chatTemplate {
		vllmTokenize(rw, r)
		return
	}
	var req struct {
		Prompt   string `json:"prompt"`
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	text := req.Prompt
	for _, m := range req.Messages {
		text += m.Content
	}
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(map[string]any{"tokens": textTokens(text), "count": len(text)})
}

func (w *testWorker) complete(rw http.ResponseWriter, r *http.Request) {
	var req struct {
		Stream bool   `json:"stream"`
		Model  string `json:"model"`
	}
	body, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(body, &req)
	if w.hold != nil && w.hold(rw, r) {
		return
	}
	if !w.serves(req.Model) {
		answerModelNotFound(rw, req.Model)
		return
	}
	w.countModel(req.Model)
	if code := int(w.status.Load()); code != 0 {
		w.answerError(rw, code)
		return
	}
	if w.hangBeforeHeaders.Load() {
		<-r.Context().Done()
		return
	}
	if w.hang.Load() {
		rw.Header().Set("Content-Type", "text/event-stream")
		rw.WriteHeader(http.StatusOK)
		rw.(http.Flusher).Flush()
		<-r.Context().Done()
		return
	}
	w.served.Add(1)
	if !req.Stream {
		rw.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(rw, `{"id":"cmpl-%d","choices":[{"text":"hello"}],"usage":{"prompt_tokens":1}}`, w.id)
		return
	}
	rw.Header().Set("Content-Type", "text/event-stream")
	rw.WriteHeader(http.StatusOK)
	for i := range 3 {
		fmt.Fprintf(rw, "data: {\"worker\":%d,\"chunk\":%d}\n\n", w.id, i)
		rw.(http.Flusher).Flush()
		if i == 1 && w.breakMid.Load() {
			// Drop the connection mid-stream, as a crashing worker does.
			conn, _, err := http.NewResponseController(rw).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		if i == 0 && w.gate != nil {
			select {
			case <-w.gate:
			case <-r.Context().Done():
				return
			}
		}
		time.Sleep(w.streamDelay)
	}
	fmt.Fprint(rw, "data: [DONE]\n\n")
}

// health is vLLM's GET /health: 200 with an empty body while the engine
// runs.
func (w *testWorker) health(rw http.ResponseWriter, _ *http.Request) {
	w.healthHit.Add(1)
	if code := int(w.status.Load()); code != 0 {
		w.answerError(rw, code)
		return
	}
	rw.WriteHeader(http.StatusOK)
}

// answerError answers code with vLLM's error body.
func (w *testWorker) answerError(rw http.ResponseWriter, code int) {
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(code)
	fmt.Fprintf(rw, `{"object":"error","message":"worker %d: status %d","type":"%s","param":null,"code":%d}`,
		w.id, code, http.StatusText(code), code)
}

// tokensJSON writes tokens as a JSON array.
func tokensJSON(tokens []uint32) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, t := range tokens {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, t)
	}
	b.WriteByte(']')
	return b.String()
}
