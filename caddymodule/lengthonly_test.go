package caddymodule

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// lengthFleet is model m on two workers of contexts short and long
// whose /tokenize answers n tokens, and a handler routing for it; asked
// counts the /tokenize calls.
func lengthFleet(t *testing.T, n int, short, long uint64) (h *Handler, asked *atomic.Int64) {
	t.Helper()
	asked = new(atomic.Int64)
	answer := `{"tokens":[` + strings.TrimSuffix(strings.Repeat("7,", n), ",") + `]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, answer)
	}))
	t.Cleanup(srv.Close)
	ep, bs, model := srv.Listener.Addr().String(), uint32(16), "m"
	worker := func(id, maxLen uint64) selection.WorkerRequest {
		return selection.WorkerRequest{WorkerID: &id, ModelName: &model, Endpoint: &ep, BlockSize: &bs, MaxModelLen: &maxLen}
	}
	router := routerWith(t, nil, worker(1, short), worker(2, long))
	return &Handler{router: router, tokenizer: newTokenizer(router, 2*time.Second, 0),
		contexts: newContextLimits(router.Catalog()), logger: zap.NewNop()}, asked
}

// TestLoadRoutedTextGoesWhereItFits: a text or chat prompt routed by load
// (its logprobs asked for, an SGLang extra_key or logprob cap) is counted
// by a worker's /tokenize when its model's workers have different
// contexts, and goes only to those it fits (helper-54's probe: 400s from
// the short worker); with one context for all, no worker is asked.
func TestLoadRoutedTextGoesWhereItFits(t *testing.T) {
	h, asked := lengthFleet(t, 500, 100, 1000)
	msg := `"messages":[{"role":"user","content":"long"}]`
	for _, tc := range []struct{ what, path, body string }{
		{"prompt_logprobs", "/v1/completions", `{"model":"m","prompt":"long","prompt_logprobs":1}`},
		{"echo with logprobs", "/v1/completions", `{"model":"m","prompt":"long","echo":true,"logprobs":1}`},
		{"a chat's echo", "/v1/chat/completions", `{"model":"m",` + msg + `,"echo":true}`},
		{"a chat's prompt_logprobs", "/v1/chat/completions", `{"model":"m",` + msg + `,"prompt_logprobs":1}`},
		{"an SGLang extra_key", "/v1/completions", `{"model":"m","prompt":"long","extra_key":"k"}`},
		{"a chat's SGLang extra_key", "/v1/chat/completions", `{"model":"m",` + msg + `,"extra_key":"k"}`},
		{"SGLang's logprob cap", "/generate", `{"text":"long","return_logprob":true,"logprob_start_len":0}`},
	} {
		toks, allowed := routeOf(t, h, tc.path, "m", tc.body)
		if toks != nil || !slices.Equal(allowed, []uint64{2}) {
			t.Errorf("%s: routed by %d tokens, allowed %v; want by load, allowed [2]", tc.what, len(toks), allowed)
		}
	}
	uniform, asked2 := lengthFleet(t, 500, 1000, 1000)
	toks, allowed := routeOf(t, uniform, "/v1/completions", "m", `{"model":"m","prompt":"long","prompt_logprobs":1}`)
	if toks != nil || allowed != nil || asked2.Load() != 0 {
		t.Errorf("one context for all: %d tokens, allowed %v, %d /tokenize calls; want by load, anywhere, none", len(toks), allowed, asked2.Load())
	}
	if asked.Load() == 0 {
		t.Error("workers of different contexts: no /tokenize call made")
	}
}

// TestCutTextIsReadWhole: /tokenize takes no truncate_prompt_tokens, so
// a text past every context that the request cuts to fit one is read
// whole and cut: it went to the context's bound, counted over and sent
// anywhere, to the short worker's 400.
func TestCutTextIsReadWhole(t *testing.T) {
	h, _ := lengthFleet(t, 5000, 100, 1000)
	over := contextFiltered.WithLabelValues("m", "over")
	o0 := testCounter(over)
	toks, allowed := routeOf(t, h, "/v1/completions", "m", `{"model":"m","prompt":"long","truncate_prompt_tokens":500}`)
	if len(toks) != 500 || !slices.Equal(allowed, []uint64{2}) || testCounter(over) != o0 {
		t.Errorf("5,000 tokens cut to 500: routed by %d tokens, allowed %v, %v counted over; want 500, [2], 0",
			len(toks), allowed, testCounter(over)-o0)
	}
	toks, allowed = routeOf(t, h, "/v1/chat/completions", "m", `{"model":"m","messages":[{"role":"user","content":"long"}],"truncate_prompt_tokens":50}`)
	if len(toks) != 50 || allowed != nil {
		t.Errorf("a chat of 5,000 tokens cut to 50: routed by %d tokens, allowed %v; want 50, anywhere", len(toks), allowed)
	}
}
