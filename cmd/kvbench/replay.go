package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"
)

// `kvbench replay --trace FILE` plays a request trace (trace.go) through a
// gateway, or through several in turn (--compare), open loop: each request
// is sent at its arrival time (divided by --speed) whatever the earlier
// ones are doing, as the trace's clients did. Each request is a streamed
// /v1/completions of the token ids its block ids stand for, sent and read
// as `kvbench run` sends a turn (runner.go). The report is run's (TTFT,
// end-to-end latency, prefix hit ratio from usage, requests per worker)
// and each policy's hit ratio as a share of two ceilings computed from the
// trace: one unbounded cache, and one LRU cache as large as the whole
// fleet's.

// replayPlan is one request to send: when (after the run's start) and
// what.
type replayPlan struct {
	At        time.Duration
	Req       traceRequest
	MaxTokens int
}

// planReplay turns the trace's requests into what is sent: the first n
// (all with n <= 0), max_tokens the trace's output length capped by
// maxTokens (when > 0) and at least 1, arrivals divided by speed. A
// request whose prompt and output exceed maxModelLen (when > 0), or need
// more than kvBlocks engine blocks of engineBlock tokens on one worker
// (when > 0), would be refused by the engine: it is skipped and counted.
func planReplay(reqs []traceRequest, n, maxTokens, maxModelLen, kvBlocks, engineBlock int, speed float64) (plan []replayPlan, skipped int) {
	if n > 0 && n < len(reqs) {
		reqs = reqs[:n]
	}
	for _, r := range reqs {
		out := r.Output
		if maxTokens > 0 {
			out = min(out, maxTokens)
		}
		out = max(out, 1)
		if maxModelLen > 0 && r.Input+out > maxModelLen ||
			kvBlocks > 0 && engineBlock > 0 && (r.Input+out+engineBlock-1)/engineBlock > kvBlocks {
			skipped++
			continue
		}
		plan = append(plan, replayPlan{At: time.Duration(float64(r.Arrival) / speed), Req: r, MaxTokens: out})
	}
	return plan, skipped
}

// replayResult is a request's result and how late it was sent.
type replayResult struct {
	result
	Lag time.Duration
}

// replayTrace sends the plan through url, each request in its own
// goroutine at its time, and waits for them all. Result i is plan[i]'s
// (its Session is i).
func replayTrace(ctx context.Context, client *http.Client, url, model string, plan []replayPlan, blockTokens int) []replayResult {
	out := make([]replayResult, len(plan))
	var wg sync.WaitGroup
	start := time.Now()
	for i, p := range plan {
		if d := time.Until(start.Add(p.At)); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			lag := time.Since(start) - p.At
			s := &session{ID: i, Turns: []turn{{Prompt: traceTokens(p.Req, blockTokens), Output: p.MaxTokens}}}
			r := request(ctx, client, url, model, s, 0, nil)
			r.Session, r.Turn, r.Text = i, 0, ""
			out[i] = replayResult{result: r, Lag: max(lag, 0)}
		}()
	}
	wg.Wait()
	return out
}

// replaySummary is one policy's replay: run's summary (Ceiling is the
// unbounded cache's, for the same completed requests; a trace has no
// sessions, so session_moves is 0) and the rest.
type replaySummary struct {
	summary
	// CapacityCeiling is the hit ratio of one LRU cache as large as the
	// fleet's, for the same completed requests (0: not computed).
	CapacityCeiling float64 `json:"prefix_hit_capacity_ceiling,omitempty"`
	// OfUnbounded and OfCapacity are the hit ratio as a share of each.
	OfUnbounded float64 `json:"hit_of_unbounded_ceiling"`
	OfCapacity  float64 `json:"hit_of_capacity_ceiling,omitempty"`
	// MaxOverMean is the busiest worker's requests over the mean.
	MaxOverMean float64 `json:"worker_max_over_mean"`
	// SendLag is how late the requests left against their schedule (the
	// load generator's own delay; large values mean the machine could
	// not keep the pace).
	SendLagMs percentiles `json:"send_lag_ms"`
}

// summarizeReplay is summarize for a replay, with the ceilings' tokens
// per planned request.
func summarizeReplay(policy, url string, rs []replayResult, elapsed time.Duration, unbounded, capacity []int) replaySummary {
	plain := make([]result, len(rs))
	var lags []float64
	var unb, capTok int64
	for i, r := range rs {
		plain[i] = r.result
		lags = append(lags, float64(r.Lag)/1e6)
		if r.Err != nil {
			continue
		}
		unb += int64(unbounded[r.Session])
		if capacity != nil {
			capTok += int64(capacity[r.Session])
		}
	}
	s := replaySummary{summary: summarize(policy, url, plain, elapsed, 0, nil, 0)}
	if s.PromptTokens > 0 {
		s.Ceiling = float64(unb) / float64(s.PromptTokens)
		s.CapacityCeiling = float64(capTok) / float64(s.PromptTokens)
	}
	if s.Ceiling > 0 {
		s.OfUnbounded = s.HitRatio / s.Ceiling
	}
	if s.CapacityCeiling > 0 {
		s.OfCapacity = s.HitRatio / s.CapacityCeiling
	}
	s.MaxOverMean = maxOverMean(s.PerWorker)
	sort.Float64s(lags)
	s.SendLagMs = percentiles{pct(lags, .5), pct(lags, .9), pct(lags, .99)}
	return s
}

// maxOverMean is the largest count over the mean count.
func maxOverMean(m map[string]int) float64 {
	if len(m) == 0 {
		return 0
	}
	most, total := 0, 0
	for _, n := range m {
		most, total = max(most, n), total+n
	}
	if total == 0 {
		return 0
	}
	return float64(most) * float64(len(m)) / float64(total)
}

// replayReport is what --json writes.
type replayReport struct {
	Trace            string          `json:"trace"`
	BlockTokens      int             `json:"block_tokens"`
	Speed            float64         `json:"speed"`
	Requests         int             `json:"requests_replayed"`
	Skipped          int             `json:"requests_skipped"`
	PromptTokens     int64           `json:"prompt_tokens"`
	FleetBlocks      int             `json:"fleet_blocks,omitempty"`
	CeilingUnbounded float64         `json:"prefix_hit_ceiling"`
	CeilingCapacity  float64         `json:"prefix_hit_capacity_ceiling,omitempty"`
	Policies         []replaySummary `json:"policies"`
}

// fleetBlocksOf is the fleet's capacity in trace blocks: given, or
// workers × kvBlocks engine blocks of engineBlock tokens; 0 if unknown.
func fleetBlocksOf(given, kvBlocks, workers, engineBlock, blockTokens int) int {
	if given > 0 {
		return given
	}
	if kvBlocks <= 0 || workers <= 0 || engineBlock <= 0 {
		return 0
	}
	return kvBlocks * workers * engineBlock / blockTokens
}

// ratioX renders a/b as "2.50x", or n/a.
func ratioX(a, b float64) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

func printReplayTable(rep replayReport) {
	fmt.Printf("%-12s %8s %6s %8s %9s %9s %9s %9s %9s %7s %7s %7s  %s\n",
		"policy", "requests", "errors", "req/s", "TTFT p50", "TTFT p90", "TTFT p99", "e2e p50", "e2e p90", "hit", "of unb", "of cap", "requests per worker")
	for _, s := range rep.Policies {
		ofCap := "-"
		if s.CapacityCeiling > 0 {
			ofCap = fmt.Sprintf("%.2f", s.OfCapacity)
		}
		fmt.Printf("%-12s %8d %6d %8.2f %8.0fms %8.0fms %8.0fms %8.0fms %8.0fms %7.3f %7.2f %7s  %s (max/mean %.2f)\n",
			s.Policy, s.Requests, s.Errors, s.ReqPerSec, s.TTFTms.P50, s.TTFTms.P90, s.TTFTms.P99, s.E2Ems.P50, s.E2Ems.P90,
			s.HitRatio, s.OfUnbounded, ofCap, spread(s.PerWorker), s.MaxOverMean)
		fmt.Printf("%-12s ceilings for these requests: unbounded %.3f", "", s.Ceiling)
		if s.CapacityCeiling > 0 {
			fmt.Printf(", capacity %.3f", s.CapacityCeiling)
		}
		fmt.Printf("; sent late by p50 %.0f ms, p99 %.0f ms\n", s.SendLagMs.P50, s.SendLagMs.P99)
		if s.CachedInUsage == 0 && s.CachedTokens > 0 {
			fmt.Printf("%-12s no usage reported cached tokens (a worker without --enable-prompt-tokens-details?): the hit ratio is kvmock's header's\n", "")
		}
		if s.FirstError != "" {
			fmt.Printf("%-12s first error: %s\n", "", s.FirstError)
		}
	}
	if len(rep.Policies) > 1 {
		base := rep.Policies[0]
		fmt.Println()
		for _, s := range rep.Policies[1:] {
			fmt.Printf("%s vs %s: prefix hit %.3f vs %.3f (%s); TTFT p50 %s lower, p90 %s lower\n",
				base.Policy, s.Policy, base.HitRatio, s.HitRatio, ratioX(base.HitRatio, s.HitRatio),
				ratioX(s.TTFTms.P50, base.TTFTms.P50), ratioX(s.TTFTms.P90, base.TTFTms.P90))
		}
	}
}

// runReplay is `kvbench replay`.
func runReplay(args []string) error {
	fs := flag.NewFlagSet("replay", flag.ExitOnError)
	tracePath := fs.String("trace", "", "the trace: Mooncake JSON Lines (timestamp, input_length, output_length, hash_ids), plain or gzipped")
	blockTokens := fs.Int("block-tokens", 512, "tokens per hash id in the trace")
	speed := fs.Float64("speed", 1, "time compression: a request is sent at its timestamp divided by this")
	requests := fs.Int("requests", 0, "replay the first N requests of the trace (0: all)")
	maxTokens := fs.Int("max-tokens", 0, "cap on a request's max_tokens, otherwise its output_length (0: no cap)")
	maxModelLen := fs.Int("max-model-len", 131072, "skip (and count) requests whose prompt plus max_tokens exceed this, as the engines would refuse them (0: send all)")
	url := fs.String("url", "http://127.0.0.1:8080", "gateway base URL (ignored with --compare)")
	compare := fs.String("compare", "", "policy=url,... : replay the trace through each in turn (the first is the baseline of the ratios)")
	reset := fs.String("reset", "", "URL to POST before each policy's replay so that each starts with cold caches (kvmock's admin /reset)")
	model := fs.String("model", "default", "model name sent in requests")
	engineBlock := fs.Int("block-size", 16, "the workers' KV block size in tokens: the ceilings count whole blocks of it")
	kvBlocks := fs.Int("kv-blocks", 0, "each worker's KV cache in blocks of --block-size: with --workers, the capacity ceiling's size; requests needing more are skipped")
	workers := fs.Int("workers", 8, "workers in the fleet, for the capacity ceiling with --kv-blocks")
	fleetBlocksFlag := fs.Int("fleet-blocks", 0, "the fleet's total KV capacity in trace blocks, for the capacity ceiling (0: from --kv-blocks x --workers)")
	timeout := fs.Duration("timeout", 5*time.Minute, "a request's time limit")
	predictions := fs.String("predictions", "",
		"the gateway's Caddy admin /kv_router/stats URL: report each policy's prediction accuracy (cached tokens predicted = reported), as kvbench run does")
	ceilingsOnly := fs.Bool("ceilings-only", false, "print the trace's figures and ceilings and send nothing")
	jsonOut := fs.String("json", "", "write the results as JSON to this file")
	plotOut := fs.String("plot", "", "write TTFT distributions per policy as SVG to this file")
	_ = fs.Parse(args)

	switch {
	case *tracePath == "":
		return fmt.Errorf("--trace is required")
	case *speed <= 0:
		return fmt.Errorf("--speed must be positive, not %v", *speed)
	case *blockTokens < 1:
		return fmt.Errorf("--block-tokens must be at least 1")
	}
	reqs, err := readTraceFile(*tracePath, *blockTokens)
	if err != nil {
		return err
	}
	targets, err := parseTargets(*url, *compare)
	if err != nil {
		return err
	}
	plan, skipped := planReplay(reqs, *requests, *maxTokens, *maxModelLen, *kvBlocks, *engineBlock, *speed)
	if len(plan) == 0 {
		return fmt.Errorf("%s: no request to replay (%d read, %d skipped)", *tracePath, len(reqs), skipped)
	}
	fleet := fleetBlocksOf(*fleetBlocksFlag, *kvBlocks, *workers, *engineBlock, *blockTokens)
	planned := make([]traceRequest, len(plan))
	for i, p := range plan {
		planned[i] = p.Req
	}
	unbounded, capacity := traceCeilings(planned, *blockTokens, *engineBlock, fleet)
	rep := replayReport{Trace: *tracePath, BlockTokens: *blockTokens, Speed: *speed, Requests: len(plan), Skipped: skipped, FleetBlocks: fleet}
	var unb, cp, outTokens int64
	for i, p := range plan {
		rep.PromptTokens += int64(p.Req.Input)
		outTokens += int64(p.MaxTokens)
		unb += int64(unbounded[i])
		if capacity != nil {
			cp += int64(capacity[i])
		}
	}
	rep.CeilingUnbounded = float64(unb) / float64(rep.PromptTokens)
	rep.CeilingCapacity = float64(cp) / float64(rep.PromptTokens)
	span := plan[len(plan)-1].At
	fmt.Printf("trace %s: %d requests replayed (%d skipped as too long), %d prompt tokens (mean %d), %d output tokens, over %.1f s at speed %g\n",
		*tracePath, len(plan), skipped, rep.PromptTokens, rep.PromptTokens/int64(len(plan)), outTokens, span.Seconds(), *speed)
	fmt.Printf("ceilings (blocks of %d tokens, never the last token, whole blocks of %d): one unbounded cache %.3f",
		*blockTokens, *engineBlock, rep.CeilingUnbounded)
	if fleet > 0 {
		fmt.Printf(", one LRU cache of the fleet's %d blocks %.3f", fleet, rep.CeilingCapacity)
	}
	fmt.Println()
	if *ceilingsOnly {
		return writeReplayJSON(*jsonOut, rep)
	}

	watch := newPredictionWatch(*predictions)
	client := &http.Client{Timeout: *timeout, Transport: &http.Transport{MaxIdleConnsPerHost: 1024, DialContext: pacedDialer(maxDialing)}}
	rep.Policies, err = runPasses(targets, *reset, watch, func(name, url string) replaySummary {
		defer client.CloseIdleConnections()
		start := time.Now()
		rs := replayTrace(context.Background(), client, url, *model, plan, *blockTokens)
		return summarizeReplay(name, url, rs, time.Since(start), unbounded, capacity)
	})
	if err != nil {
		return err
	}
	fmt.Println()
	printReplayTable(rep)
	sums := make([]summary, len(rep.Policies))
	for i, s := range rep.Policies {
		sums[i] = s.summary
	}
	printPredictions(watch, sums)
	if err := writeReplayJSON(*jsonOut, rep); err != nil {
		return err
	}
	if *plotOut != "" {
		if err := os.WriteFile(*plotOut, plotTTFT(sums), 0o644); err != nil {
			return err
		}
		fmt.Printf("\nTTFT distributions: %s\n", *plotOut)
	}
	for _, s := range rep.Policies {
		if s.Errors > 0 {
			return fmt.Errorf("%s: %d requests failed", s.Policy, s.Errors)
		}
	}
	return nil
}

// writeReplayJSON writes rep to path, if path is set.
func writeReplayJSON(path string, rep replayReport) error {
	if path == "" {
		return nil
	}
	b, _ := json.MarshalIndent(rep, "", "  ")
	return os.WriteFile(path, b, 0o644)
}
