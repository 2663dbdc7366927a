package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"
)

// summary is one policy's run, as printed and as written by --json.
type summary struct {
	Policy       string      `json:"policy"`
	URL          string      `json:"url"`
	Requests     int         `json:"requests"`
	Errors       int         `json:"errors"`
	Seconds      float64     `json:"seconds"`
	ReqPerSec    float64     `json:"req_per_s"`
	TTFTms       percentiles `json:"ttft_ms"`
	E2Ems        percentiles `json:"e2e_ms"`
	PromptTokens int64       `json:"prompt_tokens"`
	CachedTokens int64       `json:"cached_tokens"`
	HitRatio     float64     `json:"prefix_hit_ratio"`
	// Ceiling is the hit ratio one unbounded cache would have had for the
	// same completed requests (ceiling.go).
	Ceiling   float64        `json:"prefix_hit_ceiling"`
	PerWorker map[string]int `json:"requests_per_worker"`
	// Moves counts turns served by another worker than the session's
	// previous turn: each one leaves a cached context behind.
	Moves       int     `json:"session_moves"`
	CPUPerReqMs float64 `json:"gateway_cpu_ms_per_request,omitempty"`
	FirstError  string  `json:"first_error,omitempty"`
	// ChatRequests are the requests sent as chat completions.
	ChatRequests int `json:"chat_requests"`
	// CachedInUsage counts the requests whose usage reported cached
	// tokens; the others' come from kvmock's header, if at all.
	CachedInUsage int `json:"cached_in_usage"`
	// Predictions are the gateway's prediction counts during the run
	// (predictions.go), with --predictions.
	Predictions *predictionReport `json:"predictions,omitempty"`
	ttfts       []float64
}

type percentiles struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
}

func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(p*float64(len(sorted))))]
}

func summarize(policy, url string, rs []result, elapsed time.Duration, cpuTicksUsed int64, trace []session, blockSize int) summary {
	s := summary{Policy: policy, URL: url, Seconds: elapsed.Seconds(), PerWorker: map[string]int{}}
	var e2e []float64
	for _, r := range rs {
		if r.Err != nil {
			s.Errors++
			if s.FirstError == "" {
				s.FirstError = r.Err.Error()
			}
			continue
		}
		s.Requests++
		s.ttfts = append(s.ttfts, float64(r.TTFT)/1e6)
		e2e = append(e2e, float64(r.E2E)/1e6)
		s.PromptTokens += int64(r.PromptTokens)
		s.CachedTokens += int64(r.CachedTokens)
		if r.CachedReported {
			s.CachedInUsage++
		}
		if r.Session >= 0 && r.Session < len(trace) && trace[r.Session].Chat {
			s.ChatRequests++
		}
		s.PerWorker[r.Worker]++
	}
	s.Moves = sessionMoves(rs)
	sort.Float64s(s.ttfts)
	sort.Float64s(e2e)
	s.TTFTms = percentiles{pct(s.ttfts, .5), pct(s.ttfts, .9), pct(s.ttfts, .99)}
	s.E2Ems = percentiles{pct(e2e, .5), pct(e2e, .9), pct(e2e, .99)}
	if s.Seconds > 0 {
		s.ReqPerSec = float64(s.Requests) / s.Seconds
	}
	if s.PromptTokens > 0 {
		s.HitRatio = float64(s.CachedTokens) / float64(s.PromptTokens)
		s.Ceiling = float64(ceilingTokens(trace, rs, blockSize)) / float64(s.PromptTokens)
	}
	if cpuTicksUsed > 0 && s.Requests > 0 {
		s.CPUPerReqMs = float64(cpuTicksUsed) * 10 / float64(s.Requests)
	}
	return s
}

// sessionMoves counts the successful turns whose worker differs from the
// one that served the same session's previous successful turn.
func sessionMoves(rs []result) int {
	type key struct{ session, turn int }
	worker := map[key]string{}
	for _, r := range rs {
		if r.Err == nil {
			worker[key{r.Session, r.Turn}] = r.Worker
		}
	}
	moves := 0
	for k, w := range worker {
		for t := k.turn - 1; t >= 0; t-- {
			if prev, ok := worker[key{k.session, t}]; ok {
				if prev != w {
					moves++
				}
				break
			}
		}
	}
	return moves
}

// spread renders requests per worker compactly, busiest first.
func spread(m map[string]int) string {
	type kv struct {
		w string
		n int
	}
	var l []kv
	for w, n := range m {
		l = append(l, kv{w, n})
	}
	sort.Slice(l, func(i, j int) bool { return l[i].n > l[j].n || l[i].n == l[j].n && l[i].w < l[j].w })
	var b strings.Builder
	for i, e := range l {
		if i > 0 {
			b.WriteByte(' ')
		}
		w := e.w
		if w == "" {
			w = "?"
		}
		fmt.Fprintf(&b, "%s:%d", w, e.n)
	}
	return b.String()
}

func printTable(sums []summary) {
	fmt.Printf("%-12s %8s %6s %8s %10s %10s %10s %10s %8s %8s  %s\n",
		"policy", "requests", "errors", "req/s", "TTFT p50", "TTFT p90", "TTFT p99", "e2e p50", "hit", "ceiling", "requests per worker")
	for _, s := range sums {
		fmt.Printf("%-12s %8d %6d %8.1f %8.1fms %8.1fms %8.1fms %8.1fms %8.3f %8.3f  %s\n",
			s.Policy, s.Requests, s.Errors, s.ReqPerSec, s.TTFTms.P50, s.TTFTms.P90, s.TTFTms.P99, s.E2Ems.P50, s.HitRatio, s.Ceiling, spread(s.PerWorker))
		fmt.Printf("%-12s %d of %d turns moved to another worker than the session's previous turn\n", "", s.Moves, s.Requests)
		if s.CPUPerReqMs > 0 {
			fmt.Printf("%-12s gateway CPU %.2f ms per request\n", "", s.CPUPerReqMs)
		}
		if s.ChatRequests > 0 {
			fmt.Printf("%-12s %d of %d requests were chat completions with tools\n", "", s.ChatRequests, s.Requests)
		}
		if s.CachedInUsage == 0 && s.CachedTokens > 0 {
			// vLLM reports cached tokens only with --enable-prompt-tokens-details.
			fmt.Printf("%-12s no usage reported cached tokens (a worker without --enable-prompt-tokens-details?): the hit ratio is kvmock's header's\n", "")
		}
		if s.FirstError != "" {
			fmt.Printf("%-12s first error: %s\n", "", s.FirstError)
		}
	}
	if len(sums) > 1 {
		base := sums[0]
		fmt.Println()
		for _, s := range sums[1:] {
			ratio := func(a, b float64) string {
				if a == 0 {
					return "n/a"
				}
				return fmt.Sprintf("%.2fx", b/a)
			}
			fmt.Printf("%s vs %s: TTFT p50 %s lower, p90 %s lower; prefix hit %.3f vs %.3f; throughput %.2fx\n",
				base.Policy, s.Policy, ratio(base.TTFTms.P50, s.TTFTms.P50), ratio(base.TTFTms.P90, s.TTFTms.P90),
				base.HitRatio, s.HitRatio, base.ReqPerSec/max(s.ReqPerSec, 1e-9))
		}
	}
}

// runWorkload is `kvbench run`.
func runWorkload(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	url := fs.String("url", "http://127.0.0.1:8080", "gateway base URL (ignored with --compare)")
	compare := fs.String("compare", "", "policy=url,... : run the same trace through each, side by side (the first is the baseline of the ratios)")
	reset := fs.String("reset", "", "URL to POST before each run so every policy starts with cold caches (kvmock's admin /reset)")
	kind := fs.String("workload", "agentic", "agentic, multiturn or random")
	sessions := fs.Int("sessions", 32, "sessions in the trace")
	turns := fs.Int("turns", 16, "turns per session")
	conc := fs.Int("concurrency", 8, "sessions in flight at once")
	system := fs.Int("system-tokens", 2048, "agentic: tokens of the shared system prompt")
	turnTokens := fs.Int("turn-tokens", 256, "mean new tokens per turn")
	taskTokens := fs.Int("task-tokens", 6000, "agentic: mean tokens of each session's starting context")
	output := fs.Int("output-tokens", 16, "output tokens per turn")
	maxISL := fs.Int("max-isl", 16384, "a context longer than this is compacted to half of it (system prompt and latest turns)")
	chatShare := fs.Float64("chat-share", 0.5,
		"agentic: the share of sessions sent as /v1/chat/completions with text messages and tools (the gateway tokenizes them through a worker's /tokenize); the rest send token ids")
	predictions := fs.String("predictions", "",
		"the gateway's Caddy admin /kv_router/stats URL, e.g. http://127.0.0.1:2019/kv_router/stats: report each policy's prediction accuracy (cached tokens predicted = reported) during its run")
	duration := fs.Duration("duration", 60*time.Second, "stop each run after this long")
	seed := fs.Uint64("seed", 1, "trace seed: the same seed gives the same trace")
	blockSize := fs.Int("block-size", 16, "the workers' KV block size, for the hit-ratio ceiling")
	model := fs.String("model", "default", "model name sent in requests")
	pid := fs.Int("pid", 0, "gateway pid, to report its CPU time per request")
	jsonOut := fs.String("json", "", "write the results as JSON to this file")
	plotOut := fs.String("plot", "", "write TTFT distributions per policy as SVG to this file")
	_ = fs.Parse(args)

	if *chatShare < 0 || *chatShare > 1 {
		return fmt.Errorf("--chat-share must be between 0 and 1, not %v", *chatShare)
	}
	trace, err := buildTrace(workloadConfig{Kind: *kind, Sessions: *sessions, Turns: *turns, SystemTokens: *system, TaskTokens: *taskTokens,
		TurnTokens: *turnTokens, OutputTokens: *output, MaxISL: *maxISL, ChatShare: *chatShare, Seed: *seed})
	if err != nil {
		return err
	}
	watch := newPredictionWatch(*predictions)
	targets, err := parseTargets(*url, *compare)
	if err != nil {
		return err
	}
	var total, chats int
	for _, s := range trace {
		total += len(s.Turns)
		if s.Chat {
			chats++
		}
	}
	fmt.Printf("workload %s: %d sessions x %d turns (%d requests), %d sessions as chat with tools, concurrency %d, seed %d, up to %v per policy\n",
		*kind, *sessions, *turns, total, chats, *conc, *seed, *duration)
	sums, err := runPasses(targets, *reset, watch, func(name, url string) summary {
		var cpu0 int64
		if *pid > 0 {
			cpu0, _ = cpuTicks(*pid)
		}
		start := time.Now()
		rs := runTrace(context.Background(), url, *model, trace, *conc, *duration)
		elapsed := time.Since(start)
		var used int64
		if *pid > 0 {
			cpu1, _ := cpuTicks(*pid)
			used = cpu1 - cpu0
		}
		return summarize(name, url, rs, elapsed, used, trace, *blockSize)
	})
	if err != nil {
		return err
	}
	fmt.Println()
	printTable(sums)
	printPredictions(watch, sums)
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(sums, "", "  ")
		if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
			return err
		}
	}
	if *plotOut != "" {
		if err := os.WriteFile(*plotOut, plotTTFT(sums), 0o644); err != nil {
			return err
		}
		fmt.Printf("\nTTFT distributions: %s\n", *plotOut)
	}
	for _, s := range sums {
		if s.Errors > 0 {
			return fmt.Errorf("%s: %d requests failed", s.Policy, s.Errors)
		}
	}
	return nil
}

// parseTargets is the gateways a run goes through: --compare's
// policy=url pairs, or --url alone as "gateway".
func parseTargets(url, compare string) ([][2]string, error) {
	if compare == "" {
		return [][2]string{{"gateway", url}}, nil
	}
	var targets [][2]string
	for _, kv := range strings.Split(compare, ",") {
		name, u, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("--compare wants policy=url, not %q", kv)
		}
		targets = append(targets, [2]string{name, u})
	}
	return targets, nil
}
