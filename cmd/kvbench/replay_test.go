package main

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestPlanReplay: the first N requests, max_tokens capped and at least 1,
// arrivals divided by the speed, too-long requests skipped and counted.
func TestPlanReplay(t *testing.T) {
	reqs := readMini(t)
	plan, skipped := planReplay(reqs, 0, 3, 13, 0, 16, 2)
	if skipped != 1 || len(plan) != 4 {
		t.Fatalf("%d planned, %d skipped; want 4 and 1 (line 2: 12 + 2 tokens > 13)", len(plan), skipped)
	}
	var outs []int
	for _, p := range plan {
		outs = append(outs, p.MaxTokens)
	}
	if fmt.Sprint(outs) != "[3 1 3 1]" {
		t.Fatalf("max_tokens %v, want [3 1 3 1] (5 capped to 3, 0 raised to 1)", outs)
	}
	if plan[3].At != 200*time.Millisecond || plan[3].Req.Line != 6 {
		t.Fatalf("last planned %+v: want line 6 at 200ms (400ms at speed 2)", plan[3])
	}
	if plan, skipped := planReplay(reqs, 2, 0, 0, 0, 16, 1); len(plan) != 2 || skipped != 0 || plan[0].MaxTokens != 3 {
		t.Fatalf("first 2, no limits: %d planned, %d skipped, %+v", len(plan), skipped, plan)
	}
	// A worker of 1 block of 8 tokens takes no request of more than 8
	// tokens with its output: only line 4 (6 + 1 with a cap of 1) fits.
	if plan, skipped := planReplay(reqs, 0, 1, 0, 1, 8, 1); len(plan) != 1 || skipped != 4 || plan[0].Req.Line != 5 {
		t.Fatalf("one 8-token block: %d planned, %d skipped", len(plan), skipped)
	}
}

// fakeVLLM answers streamed completions as vLLM does with
// --enable-prompt-tokens-details, from one unbounded prefix cache in
// blocks of 2 tokens that never serves the last token; POST /reset
// empties it.
type fakeVLLM struct {
	mu      sync.Mutex
	prompts [][]uint32
	// maxTokens holds the max_tokens sent, by prompt length: each line
	// of the fixture has a length of its own, and requests 50 ms apart
	// may reach the engine out of order on a loaded machine.
	maxTokens map[int][]int
	bad       []string
	served    int64 // completions answered, never reset
}

func (f *fakeVLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.URL.Path == "/reset" {
		f.prompts = nil
		return
	}
	var req struct {
		Stream        bool `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		MaxTokens *int     `json:"max_tokens"`
		Prompt    []uint32 `json:"prompt"`
		Model     string   `json:"model"`
	}
	if r.URL.Path != "/v1/completions" || json.NewDecoder(r.Body).Decode(&req) != nil || !req.Stream ||
		!req.StreamOptions.IncludeUsage || req.MaxTokens == nil || len(req.Prompt) == 0 || req.Model != "m" {
		f.bad = append(f.bad, r.URL.Path)
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	best := 0
	for _, p := range f.prompts {
		best = max(best, commonPrefix(req.Prompt, p))
	}
	cached := min(best, len(req.Prompt)-1) / 2 * 2
	f.prompts = append(f.prompts, req.Prompt)
	if f.maxTokens == nil {
		f.maxTokens = map[int][]int{}
	}
	f.maxTokens[len(req.Prompt)] = append(f.maxTokens[len(req.Prompt)], *req.MaxTokens)
	f.served++
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Kvmock-Worker", fmt.Sprint(1+len(f.prompts)%2))
	for range *req.MaxTokens {
		fmt.Fprint(w, `data: {"choices":[{"index":0,"text":" x"}]}`+"\n\n")
	}
	fmt.Fprintf(w, `data: {"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`+"\n\n",
		len(req.Prompt), *req.MaxTokens, cached)
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// TestReplayEndToEnd replays the fixture through two "policies" (the same
// fake engine, emptied between them) and checks the JSON report: what was
// sent, the hit ratio read from usage, and the ceilings, which for an
// engine with one unbounded cache the hit ratio must reach exactly. That
// also shows that the generator makes equal tokens exactly where the
// trace's block ids agree.
func TestReplayEndToEnd(t *testing.T) {
	eng := &fakeVLLM{}
	srv := httptest.NewServer(eng)
	defer srv.Close()
	// The gateway's admin: predictions counted per answer, all exact.
	admin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		eng.mu.Lock()
		n := eng.served
		eng.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]any{"predictions": map[string]modelPredictions{"m": {Requests: n, CachedExact: n}}})
	}))
	defer admin.Close()
	out := t.TempDir() + "/replay.json"
	svg := t.TempDir() + "/ttft.svg"
	err := runReplay([]string{"--predictions", admin.URL, "--trace", miniTrace, "--block-tokens", "4", "--block-size", "2", "--fleet-blocks", "3",
		"--max-tokens", "3", "--max-model-len", "13", "--speed", "2", "--model", "m",
		"--compare", "a=" + srv.URL + ",b=" + srv.URL, "--reset", srv.URL + "/reset", "--json", out, "--plot", svg})
	if err != nil {
		t.Fatal(err)
	}
	if len(eng.bad) > 0 {
		t.Fatalf("requests refused: %v", eng.bad)
	}
	// Lines 1, 3, 5 and 6 (10, 8, 6 and 9 tokens), once per policy: 5
	// output tokens capped to 3, 0 raised to 1.
	if fmt.Sprint(eng.maxTokens) != "map[6:[3 3] 8:[1 1] 9:[1 1] 10:[3 3]]" {
		t.Fatalf("max_tokens sent %v", eng.maxTokens)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep replayReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	// Line 2 is skipped (12 + 2 > 13). Unbounded: lines 3 and 6 reuse 6
	// and 8 of 10 + 8 + 6 + 9 = 33 tokens. With 3 blocks, line 6 finds
	// only its first block (line 5's two new blocks evicted the second):
	// 6 + 4 tokens.
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if rep.Requests != 4 || rep.Skipped != 1 || rep.PromptTokens != 33 || !near(rep.CeilingUnbounded, 14.0/33) ||
		!near(rep.CeilingCapacity, 10.0/33) || rep.FleetBlocks != 3 || len(rep.Policies) != 2 {
		t.Fatalf("report %s", b)
	}
	for _, p := range rep.Policies {
		if p.Requests != 4 || p.Errors != 0 || p.PromptTokens != 33 || p.CachedTokens != 14 || p.CachedInUsage != 4 ||
			!near(p.HitRatio, 14.0/33) || !near(p.Ceiling, 14.0/33) || !near(p.CapacityCeiling, 10.0/33) ||
			!near(p.OfUnbounded, 1) || !near(p.OfCapacity, 1.4) || p.PerWorker["1"]+p.PerWorker["2"] != 4 ||
			p.TTFTms.P50 <= 0 || p.E2Ems.P99 < p.TTFTms.P50 || p.Predictions == nil || p.Predictions.Requests != 4 || p.Predictions.Accuracy != 1 {
			t.Fatalf("policy %s: %+v", p.Policy, p)
		}
	}
	if !strings.Contains(string(b), `"policy": "b"`) {
		t.Fatalf("no policy b in %s", b)
	}
	if s, err := os.ReadFile(svg); err != nil || !strings.Contains(string(s), "<svg") {
		t.Fatalf("plot: %v", err)
	}
}

// TestReplayCountsFailures: a gateway that refuses every request makes
// the replay fail, after reporting them as errors.
func TestReplayCountsFailures(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	out := t.TempDir() + "/replay.json"
	err := runReplay([]string{"--trace", miniTrace, "--block-tokens", "4", "--speed", "100", "--url", srv.URL, "--json", out})
	if err == nil || !strings.Contains(err.Error(), "5 requests failed") {
		t.Fatalf("error %v", err)
	}
	var rep replayReport
	b, _ := os.ReadFile(out)
	if json.Unmarshal(b, &rep) != nil || len(rep.Policies) != 1 || rep.Policies[0].Errors != 5 || rep.Policies[0].FirstError != "status 503" {
		t.Fatalf("report %s", b)
	}
}

// TestReplayFlags refuses what cannot run.
func TestReplayFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--trace is required"},
		{[]string{"--trace", miniTrace, "--speed", "0"}, "--speed must be positive"},
		{[]string{"--trace", miniTrace}, "makes 1 blocks of 512 tokens, but hash_ids has 3"},
		{[]string{"--trace", miniTrace, "--block-tokens", "4", "--max-model-len", "2"}, "no request to replay"},
		{[]string{"--trace", miniTrace, "--block-tokens", "4", "--compare", "x"}, "--compare wants policy=url"},
	} {
		if err := runReplay(c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}
