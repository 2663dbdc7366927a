// Command kvsim drives the real selection.Router and indexer.Index in
// virtual time: simulated engines (kvmock's engine model, internal/engine)
// serve a workload of agentic sessions or a Mooncake-format trace, their
// KV events reach the index after a delay, and each policy's hit ratio,
// time to first token and load spread are compared. No HTTP, no sockets;
// the same seed gives byte-identical JSON. docs/kvsim.md has the model and
// its choices.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kvsim:", err)
		os.Exit(1)
	}
}

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, " ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// report is the JSON output: the setup and each policy's result.
type report struct {
	Config  *config   `json:"config"`
	Skipped int       `json:"trace_skipped,omitempty"`
	Results []*result `json:"results"`
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvsim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &config{}
	fs.Uint64Var(&c.Seed, "seed", 1, "seed of every random draw")
	fs.IntVar(&c.Workers, "workers", 1024, "workers (one engine each)")
	fs.IntVar(&c.BlockSize, "block-size", 512, "tokens per KV block, engines and router alike")
	fs.IntVar(&c.KVBlocks, "kv-blocks", 2048, "KV-cache capacity per worker, in blocks")
	fs.Float64Var(&c.PrefillRate, "prefill-rate", 10000, "uncached prompt tokens an engine computes per second")
	fs.DurationVar(&c.DecodeTime, "decode-time", 20*time.Millisecond, "duration of a step that samples output tokens")
	fs.IntVar(&c.MaxBatchedTokens, "max-batched-tokens", 8192, "token budget of one scheduler step")
	fs.IntVar(&c.MaxNumSeqs, "max-num-seqs", 256, "sequences an engine runs at once")
	fs.DurationVar(&c.EventDelay, "event-delay", 10*time.Millisecond, "delay from an engine's step to its KV events reaching the index")
	fs.Int64Var(&c.IndexMaxMemory, "index-max-memory", 2<<30, "the index's memory budget in bytes, as index_max_memory")
	fs.IntVar(&c.Sessions, "sessions", 8192, "concurrent agentic sessions")
	fs.IntVar(&c.SystemPrompt, "system-prompt", 4096, "tokens of the system prompt every session shares")
	fs.IntVar(&c.StartMin, "start-min", 30000, "a session's first prompt, least tokens")
	fs.IntVar(&c.StartMax, "start-max", 70000, "a session's first prompt, most tokens")
	fs.IntVar(&c.EndMin, "end-min", 130000, "a session ends once its context passes a length drawn from [end-min, end-max]")
	fs.IntVar(&c.EndMax, "end-max", 170000, "see --end-min")
	fs.IntVar(&c.UserMin, "user-min", 500, "new user (tool output) tokens per turn, least")
	fs.IntVar(&c.UserMax, "user-max", 3500, "new user tokens per turn, most")
	fs.IntVar(&c.OutputMin, "output-min", 100, "output tokens per turn, least")
	fs.IntVar(&c.OutputMax, "output-max", 700, "output tokens per turn, most")
	fs.DurationVar(&c.ThinkMin, "think-min", time.Second, "time between a turn's answer and the next turn, least")
	fs.DurationVar(&c.ThinkMax, "think-max", 9*time.Second, "time between turns, most")
	fs.DurationVar(&c.Ramp, "ramp", 120*time.Second, "the first turns of the sessions are spread over this")
	fs.StringVar(&c.Trace, "trace", "", "replay this Mooncake-format trace (JSONL, gzipped or not) instead of sessions")
	fs.IntVar(&c.TraceRequests, "requests", 1600, "with --trace: its first N requests (0: all)")
	fs.Float64Var(&c.Speed, "speed", 4, "with --trace: arrival times divided by this")
	fs.IntVar(&c.MaxModelLen, "max-model-len", 131072, "with --trace: longer requests (prompt + output) are skipped")
	fs.DurationVar(&c.Warmup, "warmup", 150*time.Second, "virtual time before the measured window (sessions)")
	fs.DurationVar(&c.Duration, "duration", 300*time.Second, "virtual time the run ends (sessions)")
	fs.IntVar(&c.Buckets, "buckets", 30, "time buckets of the load-spread series")
	policies := fs.String("policies", strings.Join(defaultPolicies, ","), "policies to run, in order (built-in names and --router-config names)")
	var variantFlags stringList
	fs.Var(&variantFlags, "router-config", "NAME={json}: a kv_router variant, cost knobs by their Caddyfile names over our defaults (\"base\":\"dynamo\" for Dynamo's); repeatable; add NAME to --policies (it is added at the end if absent)")
	jsonPath := fs.String("json", "", "write the results as JSON to this file")
	svgPath := fs.String("svg", "", "write hit ratio, TTFT and load spread as SVG to this file")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file")
	measureIndex := fs.Bool("index-memory", false, "after each policy that feeds the index, print what its final placement costs in a fresh index (heap bytes per entry); not in the JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	var variants []variant
	for _, v := range variantFlags {
		pv, err := parseVariant(v)
		if err != nil {
			return err
		}
		variants = append(variants, pv)
	}
	names := strings.Split(*policies, ",")
	for _, v := range variants {
		found := false
		for _, n := range names {
			found = found || n == v.name
		}
		if !found {
			names = append(names, v.name)
		}
	}

	var wl workload
	rep := &report{Config: c}
	if c.Trace != "" {
		// The session workload's settings do not apply: leave them out of
		// the report.
		*c = config{Seed: c.Seed, Workers: c.Workers, BlockSize: c.BlockSize, KVBlocks: c.KVBlocks, PrefillRate: c.PrefillRate,
			DecodeTime: c.DecodeTime, MaxBatchedTokens: c.MaxBatchedTokens, MaxNumSeqs: c.MaxNumSeqs, EventDelay: c.EventDelay,
			IndexMaxMemory: c.IndexMaxMemory, Trace: c.Trace, TraceRequests: c.TraceRequests, Speed: c.Speed,
			MaxModelLen: c.MaxModelLen, Buckets: c.Buckets}
		tw, skipped, err := loadTrace(c)
		if err != nil {
			return err
		}
		rep.Skipped = skipped
		c.Duration = tw.lastArrival() + time.Millisecond
		c.Drain = time.Hour
		wl = tw
	} else {
		wl = sessionWorkload{cfg: c}
	}
	if err := c.validate(); err != nil {
		return err
	}
	h := newHasher(c.BlockSize, c.Trace != "")
	fmt.Fprintf(stdout, "%-18s %9s %8s %9s %9s %9s %9s %10s %8s %7s\n",
		"policy", "requests", "hit", "ttft_p50", "ttft_p90", "ttft_p99", "mean_isl", "prefill", "moved", "wall")
	fmt.Fprintf(stdout, "%-18s %9s %8s %9s %9s %9s %9s %10s %8s %7s\n",
		"", "", "ratio", "s", "s", "s", "tokens", "max/mean", "", "s")
	for _, name := range names {
		s := newSim(c, h)
		p, err := newPolicy(s, name, variants)
		if err != nil {
			return err
		}
		s.policy = p
		start := time.Now()
		r, err := s.run(wl)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		r.Policy = name
		rep.Results = append(rep.Results, r)
		fmt.Fprintf(stdout, "%-18s %9d %8.4f %9.3f %9.3f %9.3f %9.0f %10.3f %8.4f %7.1f\n",
			name, r.Requests, r.HitRatio, r.TTFTP50, r.TTFTP90, r.TTFTP99, r.MeanISL, r.PrefillMaxOverMean,
			r.MovedFraction, time.Since(start).Seconds())
		if r.Unfinished > 0 || r.Refused > 0 || r.ApplyErrors > 0 {
			fmt.Fprintf(stdout, "%-18s   (%d without a first token at the end, counted as their wait so far; %d refused; %d index apply errors)\n",
				"", r.Unfinished, r.Refused, r.ApplyErrors)
		}
		if *measureIndex && r.IndexEntries > 0 {
			n, per, err := indexMemory(s.index, s.part, c.BlockSize)
			if err != nil {
				return fmt.Errorf("%s: index memory: %w", name, err)
			}
			fmt.Fprintf(stdout, "%-18s   (index placement: %d entries, %.1f heap bytes per entry rebuilt alone)\n", "", n, per)
		}
		runtime.GC()
	}
	if rep.Skipped > 0 {
		fmt.Fprintf(stdout, "trace: %d requests skipped (longer than --max-model-len or a worker's cache)\n", rep.Skipped)
	}
	if *jsonPath != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*jsonPath, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if *svgPath != "" {
		if err := os.WriteFile(*svgPath, plotSVG(rep), 0o644); err != nil {
			return err
		}
	}
	return nil
}
