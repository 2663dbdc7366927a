// Command kvbench drives load at a caddy-kvrouter gateway and reports what
// it measured: throughput, latency and, given the gateway's pid, the
// gateway's CPU time per request. Modes:
//
//	kvbench select       POST /select (or /select_and_reserve) bodies with a
//	                     long random token prompt to the selection API
//	kvbench completions  POST /v1/completions with an integer-array prompt
//	                     through the proxy path
//	kvbench sink         serve as a minimal upstream: read each request
//	                     whole and answer a tiny completion (for proxy
//	                     benchmarks, where the upstream must cost nothing)
//	kvbench run          replay a session workload (agentic, multiturn,
//	                     random) through a gateway and report TTFT, latency,
//	                     prefix hit ratio and per-worker spread; --compare
//	                     runs the same trace through several gateways
//	                     (policies) side by side; a share of the agentic
//	                     sessions (--chat-share) talk chat with tools, and
//	                     --predictions reports the gateway's prediction
//	                     accuracy per policy
//	kvbench replay       replay a request trace (Mooncake JSON Lines:
//	                     arrival times, lengths, 512-token block ids)
//	                     open loop through one gateway or several
//	                     (--compare) and report what run reports plus
//	                     the hit ratio as a share of two ceilings the
//	                     trace allows (replay.go, trace.go)
//	kvbench openloop     streamed completions of fresh prompts arriving
//	                     at a fixed mean rate (open loop), or a closed
//	                     loop for the fleet's capacity: admitted TTFT and
//	                     the 429s (openloop.go)
//	kvbench stats        read a gateway's selection latency histogram and
//	                     KV-event counters (and a kvmock fleet's): wait
//	                     until every worker is followed, record them before
//	                     a run, report the change after it (see stats.go)
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	if len(os.Args) >= 2 && os.Args[1] == "sink" {
		fs := flag.NewFlagSet("sink", flag.ExitOnError)
		listen := fs.String("listen", "127.0.0.1:9101", "address to serve on (loopback)")
		_ = fs.Parse(os.Args[2:])
		fmt.Fprintln(os.Stderr, "kvbench sink:", sink(*listen))
		os.Exit(1)
	}
	if len(os.Args) >= 2 && os.Args[1] == "stats" {
		if err := runStats(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "kvbench stats:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) >= 2 && os.Args[1] == "run" {
		if err := runWorkload(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "kvbench:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) >= 2 && os.Args[1] == "replay" {
		if err := runReplay(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "kvbench replay:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) >= 2 && os.Args[1] == "openloop" {
		if err := runOpenLoop(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "kvbench openloop:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) < 2 || os.Args[1] != "select" && os.Args[1] != "completions" {
		fmt.Fprintln(os.Stderr, "usage: kvbench select|completions|sink|run|replay|openloop|stats [flags]   (see kvbench run -h, kvbench replay -h)")
		os.Exit(2)
	}
	mode := os.Args[1]
	fs := flag.NewFlagSet(mode, flag.ExitOnError)
	defaultURL := "http://127.0.0.1:8092"
	if mode == "completions" {
		defaultURL = "http://127.0.0.1:8080"
	}
	url := fs.String("url", defaultURL, "base URL: the selection API (select) or the gateway (completions)")
	tokens := fs.Int("tokens", 100_000, "prompt length in tokens (random ids < 150,000)")
	requests := fs.Int("requests", 200, "number of requests")
	conc := fs.Int("concurrency", 2, "concurrent clients")
	pid := fs.Int("pid", 0, "gateway pid, to report its CPU time per request")
	reserve := fs.Bool("reserve", false, "use /select_and_reserve and free each reservation")
	_ = fs.Parse(os.Args[2:])
	if err := run(mode, *url, *tokens, *requests, *conc, *pid, *reserve); err != nil {
		fmt.Fprintln(os.Stderr, "kvbench:", err)
		os.Exit(1)
	}
}
