package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestTraceIsDeterministicAndShaped(t *testing.T) {
	cfg := workloadConfig{Kind: "agentic", Sessions: 4, Turns: 5, SystemTokens: 64, TurnTokens: 16, OutputTokens: 4, MaxISL: 1 << 20, Seed: 7}
	a, err := buildTrace(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := buildTrace(cfg)
	for s := range a {
		for k := range a[s].Turns {
			if !slices.Equal(a[s].Turns[k].Prompt, b[s].Turns[k].Prompt) {
				t.Fatal("the same seed gave another trace")
			}
		}
	}
	cfg.Seed = 8
	c, _ := buildTrace(cfg)
	if slices.Equal(a[0].Turns[0].Prompt, c[0].Turns[0].Prompt) {
		t.Fatal("another seed gave the same trace")
	}
	// Agentic: every session starts with the same system prompt, and each
	// turn's prompt extends the previous one.
	for s := range a {
		if !slices.Equal(a[s].Turns[0].Prompt[:64], a[0].Turns[0].Prompt[:64]) {
			t.Fatal("sessions do not share the system prompt")
		}
		for k := 1; k < len(a[s].Turns); k++ {
			prev, cur := a[s].Turns[k-1].Prompt, a[s].Turns[k].Prompt
			if len(cur) <= len(prev) || !slices.Equal(cur[:len(prev)], prev) {
				t.Fatalf("session %d turn %d does not extend its context", s, k)
			}
		}
	}
	// A context over max-isl is compacted to half of it, keeping the
	// system prompt, and then grows again from there: one new prefix per
	// compaction, not one per turn.
	cfg.MaxISL = 100
	d, _ := buildTrace(cfg)
	compactions := 0
	for k := 1; k < len(d[0].Turns); k++ {
		prev, cur := d[0].Turns[k-1].Prompt, d[0].Turns[k].Prompt
		if len(cur) > 100 || !slices.Equal(cur[:25], c[0].Turns[0].Prompt[:25]) {
			t.Fatalf("turn %d: %d tokens, or the system prompt lost", k, len(cur))
		}
		if len(cur) > len(prev) && slices.Equal(cur[:len(prev)], prev) {
			continue
		}
		compactions++
		if len(cur) > 50 {
			t.Fatalf("turn %d compacted to %d tokens, want at most 50", k, len(cur))
		}
	}
	if compactions == 0 || compactions == len(d[0].Turns)-1 {
		t.Fatalf("%d compactions in %d turns", compactions, len(d[0].Turns))
	}
	// Random: no reuse between turns.
	cfg.Kind, cfg.MaxISL = "random", 0
	r, _ := buildTrace(cfg)
	if slices.Equal(r[0].Turns[0].Prompt[:8], r[0].Turns[1].Prompt[:8]) {
		t.Fatal("random turns share a prefix")
	}
	if _, err := buildTrace(workloadConfig{Kind: "bogus"}); err == nil {
		t.Fatal("an unknown workload was accepted")
	}
}

// TestRunTraceMeasures plays a trace against a real HTTP server that
// streams SSE with usage, like a worker behind the gateway.
func TestRunTraceMeasures(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Kvmock-Worker", fmt.Sprint(n%2+1))
		time.Sleep(2 * time.Millisecond)
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n")
		w.(http.Flusher).Flush()
		fmt.Fprint(w, `data: {"choices":[],"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":75}}}`+"\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer srv.Close()
	trace, _ := buildTrace(workloadConfig{Kind: "multiturn", Sessions: 3, Turns: 4, TurnTokens: 8, OutputTokens: 2, Seed: 1})
	rs := runTrace(context.Background(), srv.URL, "m", trace, 2, time.Minute)
	s := summarize("p", srv.URL, rs, time.Second, 0, trace, 4)
	if s.Requests != 12 || s.Errors != 0 || s.HitRatio != 0.75 || s.TTFTms.P50 <= 0 || len(s.PerWorker) != 2 {
		t.Fatalf("summary %+v", s)
	}
	if want := float64(ceilingTokens(trace, rs, 4)) / float64(s.PromptTokens); s.Ceiling != want || s.Ceiling <= 0 || s.Ceiling >= 1 {
		t.Fatalf("ceiling %v, want %v in (0, 1)", s.Ceiling, want)
	}
	svg := string(plotTTFT([]summary{s, s}))
	if !strings.HasPrefix(svg, "<svg") || strings.Count(svg, "<polyline") != 2 {
		t.Fatalf("plot: %.200s", svg)
	}
	// A failing gateway is counted, not hidden.
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusServiceUnavailable) }))
	defer bad.Close()
	s = summarize("bad", bad.URL, runTrace(context.Background(), bad.URL, "m", trace[:1], 1, time.Minute), time.Second, 0, trace, 4)
	if s.Errors != 4 || !strings.Contains(s.FirstError, "503") {
		t.Fatalf("errors %d first %q", s.Errors, s.FirstError)
	}
}
