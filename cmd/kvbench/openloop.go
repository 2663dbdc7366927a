package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
)

// kvbench openloop: requests arrive at a fixed mean rate (Poisson
// arrivals, exponential gaps), whatever the gateway answers, as an
// overloaded service sees them: a slow answer does not slow the clients
// down (a closed loop would, and would hide the overload). Each request
// streams a completion of a fresh random prompt (no cache to reuse, so
// every request costs its full prefill and the fleet's capacity is a
// number of requests per second). It reports the admitted requests'
// TTFT, the 429s and how fast they came, and, with --concurrency, runs a
// closed loop instead to measure the capacity: the requests per second
// the fleet completes when it is never idle.
//
// kvbench openloop --table A.json B.json ... prints the runs side by side,
// with each run's TTFT p99 as a ratio of the first's.

// openLoopRun is one run's figures (its --json).
type openLoopRun struct {
	Label       string  `json:"label"`
	OfferedRPS  float64 `json:"offered_rps"` // 0 for a closed loop
	Concurrency int     `json:"concurrency,omitempty"`
	DurationS   float64 `json:"duration_s"`
	Sent        int     `json:"sent"`
	Admitted    int     `json:"admitted"` // 2xx
	Shed        int     `json:"shed"`     // 429
	Errors      int     `json:"errors"`   // anything else, timeouts included
	GoodputRPS  float64 `json:"goodput_rps"`
	// TTFT of admitted requests, in seconds.
	TTFTP50 float64 `json:"ttft_p50_s"`
	TTFTP90 float64 `json:"ttft_p90_s"`
	TTFTP99 float64 `json:"ttft_p99_s"`
	// Time to a 429, in seconds, and the share of 429s within 100 ms.
	ShedP50    float64 `json:"shed_p50_s"`
	ShedP99    float64 `json:"shed_p99_s"`
	ShedMax    float64 `json:"shed_max_s"`
	ShedUnder  float64 `json:"shed_within_100ms"`
	FirstError string  `json:"first_error,omitempty"`
}

// openLoopOutcome is what one request measured.
type openLoopOutcome struct {
	status int
	ttft   time.Duration // to the first body byte of a 2xx
	took   time.Duration // to the end of the answer
	err    error
}

func runOpenLoop(args []string) error {
	fs := flag.NewFlagSet("openloop", flag.ExitOnError)
	url := fs.String("url", "http://127.0.0.1:8080", "the gateway's base URL")
	model := fs.String("model", "default", "model name")
	rate := fs.Float64("rate", 10, "mean arrival rate, requests per second (open loop)")
	conc := fs.Int("concurrency", 0, "run a closed loop with this many clients instead (capacity)")
	duration := fs.Duration("duration", 30*time.Second, "how long requests arrive")
	tokens := fs.Int("tokens", 2000, "prompt tokens per request (random, uncached)")
	output := fs.Int("output-tokens", 16, "max_tokens per request")
	seed := fs.Uint64("seed", 1, "random seed (arrivals and prompts)")
	timeout := fs.Duration("timeout", 2*time.Minute, "a request's timeout (an error past it)")
	label := fs.String("label", "", "the run's name in the table")
	jsonOut := fs.String("json", "", "write the run's figures here")
	table := fs.Bool("table", false, "print the runs in the JSON files given as arguments side by side")
	_ = fs.Parse(args)
	if *table {
		return printOpenLoopTable(fs.Args())
	}
	if *rate <= 0 && *conc <= 0 {
		return errors.New("--rate or --concurrency must be positive")
	}
	run := openLoop(*url, *model, *rate, *conc, *duration, *tokens, *output, *seed, *timeout)
	run.Label = *label
	printOpenLoopRun(&run)
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(run, "", "  ")
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func openLoop(url, model string, rate float64, conc int, duration time.Duration, tokens, output int, seed uint64, timeout time.Duration) openLoopRun {
	client := &http.Client{Timeout: timeout, Transport: &http.Transport{MaxIdleConnsPerHost: 1024,
		DialContext: pacedDialer(maxDialing)}}
	rng := rand.New(rand.NewPCG(seed, 2))
	var mu sync.Mutex
	var outs []openLoopOutcome
	var wg sync.WaitGroup
	one := func(prompt []byte) {
		o := streamOne(client, url+"/v1/completions", prompt)
		mu.Lock()
		outs = append(outs, o)
		mu.Unlock()
	}
	start := time.Now()
	end := start.Add(duration)
	sent := 0
	if conc > 0 {
		var n sync.Mutex
		for c := range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(seed, uint64(c)+3))
				for time.Now().Before(end) {
					n.Lock()
					sent++
					n.Unlock()
					one(promptBody(r, model, tokens, output))
				}
			}()
		}
	} else {
		ctx, cancel := context.WithDeadline(context.Background(), end)
		next := start
		for {
			next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
			if !next.Before(end) {
				break
			}
			select {
			case <-time.After(time.Until(next)):
			case <-ctx.Done():
			}
			body := promptBody(rng, model, tokens, output)
			sent++
			wg.Go(func() { one(body) })
		}
		cancel()
	}
	wg.Wait()
	return summarizeOpenLoop(outs, sent, rate, conc, duration)
}

// promptBody is a streamed completion of a fresh random prompt.
func promptBody(rng *rand.Rand, model string, tokens, output int) []byte {
	b := fmt.Appendf(nil, `{"model":%q,"max_tokens":%d,"stream":true,"prompt":[`, model, output)
	for i := range tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(rng.IntN(150000)), 10)
	}
	return append(b, "]}"...)
}

// streamOne sends one request and reads its answer whole.
func streamOne(client *http.Client, url string, body []byte) openLoopOutcome {
	t0 := time.Now()
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return openLoopOutcome{err: err, took: time.Since(t0)}
	}
	defer resp.Body.Close()
	o := openLoopOutcome{status: resp.StatusCode}
	var first [1]byte
	if _, err := io.ReadFull(resp.Body, first[:]); err == nil {
		o.ttft = time.Since(t0)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		o.err = err
	}
	o.took = time.Since(t0)
	return o
}

func summarizeOpenLoop(outs []openLoopOutcome, sent int, rate float64, conc int, duration time.Duration) openLoopRun {
	run := openLoopRun{Sent: sent, DurationS: duration.Seconds(), Concurrency: conc}
	if conc == 0 {
		run.OfferedRPS = rate
	}
	var ttft, shed []float64
	for _, o := range outs {
		switch {
		case o.err == nil && o.status >= 200 && o.status < 300:
			run.Admitted++
			ttft = append(ttft, o.ttft.Seconds())
		case o.err == nil && o.status == http.StatusTooManyRequests:
			run.Shed++
			shed = append(shed, o.took.Seconds())
		default:
			run.Errors++
			if run.FirstError == "" {
				if o.err != nil {
					run.FirstError = o.err.Error()
				} else {
					run.FirstError = "status " + strconv.Itoa(o.status)
				}
			}
		}
	}
	slices.Sort(ttft)
	slices.Sort(shed)
	run.GoodputRPS = float64(run.Admitted) / duration.Seconds()
	run.TTFTP50, run.TTFTP90, run.TTFTP99 = pct(ttft, 0.5), pct(ttft, 0.9), pct(ttft, 0.99)
	if len(shed) > 0 {
		run.ShedP50, run.ShedP99, run.ShedMax = pct(shed, 0.5), pct(shed, 0.99), shed[len(shed)-1]
		n, _ := slices.BinarySearch(shed, 0.1)
		run.ShedUnder = float64(n) / float64(len(shed))
	}
	return run
}

func printOpenLoopRun(r *openLoopRun) {
	load := fmt.Sprintf("offered %.1f req/s", r.OfferedRPS)
	if r.Concurrency > 0 {
		load = fmt.Sprintf("closed loop, %d clients", r.Concurrency)
	}
	fmt.Printf("%s: %s for %.0f s: sent %d, admitted %d (%.1f req/s), 429 %d, errors %d\n",
		r.Label, load, r.DurationS, r.Sent, r.Admitted, r.GoodputRPS, r.Shed, r.Errors)
	fmt.Printf("  TTFT of admitted: p50 %.3f s  p90 %.3f s  p99 %.3f s\n", r.TTFTP50, r.TTFTP90, r.TTFTP99)
	if r.Shed > 0 {
		fmt.Printf("  time to 429: p50 %.1f ms  p99 %.1f ms  max %.1f ms; %.1f%% within 100 ms\n",
			r.ShedP50*1e3, r.ShedP99*1e3, r.ShedMax*1e3, 100*r.ShedUnder)
	}
	if r.FirstError != "" {
		fmt.Printf("  first error: %s\n", r.FirstError)
	}
}

// printOpenLoopTable prints runs side by side, TTFT p99 as a ratio of the
// first run's.
func printOpenLoopTable(files []string) error {
	var runs []openLoopRun
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var r openLoopRun
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		runs = append(runs, r)
	}
	if len(runs) == 0 {
		return errors.New("no runs given")
	}
	fmt.Printf("| run | offered req/s | sent | admitted (req/s) | 429 | errors | TTFT p50 | TTFT p99 | p99 / first run's | 429 p99 | 429 within 100 ms |\n")
	fmt.Printf("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		offered := fmt.Sprintf("%.1f", r.OfferedRPS)
		if r.Concurrency > 0 {
			offered = fmt.Sprintf("closed, %d clients", r.Concurrency)
		}
		shedP99, within := "–", "–"
		if r.Shed > 0 {
			shedP99, within = fmt.Sprintf("%.0f ms", r.ShedP99*1e3), fmt.Sprintf("%.1f%%", 100*r.ShedUnder)
		}
		ratio := "–"
		if runs[0].TTFTP99 > 0 {
			ratio = fmt.Sprintf("%.2f×", r.TTFTP99/runs[0].TTFTP99)
		}
		fmt.Printf("| %s | %s | %d | %d (%.1f) | %d | %d | %.3f s | %.3f s | %s | %s | %s |\n",
			r.Label, offered, r.Sent, r.Admitted, r.GoodputRPS, r.Shed, r.Errors, r.TTFTP50, r.TTFTP99, ratio, shedP99, within)
	}
	return nil
}
