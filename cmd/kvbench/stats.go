package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// `kvbench stats` reads a running gateway (Caddy's admin: /metrics and
// /kv_router/stats) and, optionally, a kvmock fleet (its admin /stats), for
// runs that need more than the client's view:
//
//	kvbench stats --ready N        wait until N workers are schedulable, N
//	                               listeners run and N fleet ranks have a
//	                               subscriber (nothing published is lost to
//	                               a slow-joining subscriber)
//	kvbench stats --save FILE      record the counters before a run
//	kvbench stats --since FILE     report what changed since then: selection
//	                               latency quantiles and the KV-event
//	                               stream's health, waiting (--wait) until
//	                               the gateway has received every batch the
//	                               fleet published; with --run, the
//	                               client's figures (kvbench run --json)
//	                               too; with --check, exit 1 unless the
//	                               stream was whole

// selectionMetric is the gateway's histogram of select-and-reserve times.
const selectionMetric = "kvrouter_selection_duration_seconds"

// histogram is a Prometheus histogram as scraped: cumulative counts per
// upper bound, the last bound +Inf.
type histogram struct {
	Bounds []float64 `json:"-"`  // the last is +Inf, which JSON cannot hold
	LE     []string  `json:"le"` // the bounds as scraped, for --save files
	Counts []uint64  `json:"counts"`
	Count  uint64    `json:"count"`
	Sum    float64   `json:"sum"`
}

// snapshot is what the gateway and the fleet reported at one moment.
type snapshot struct {
	Time       time.Time         `json:"time"`
	Selection  histogram         `json:"selection"`
	Events     map[string]uint64 `json:"kv_events"`
	Workers    int               `json:"workers"`
	Scheduled  int               `json:"schedulable_workers"`
	FleetRanks int               `json:"fleet_ranks"`
	Subscribed int               `json:"fleet_subscribed_ranks"`
	Published  int64             `json:"fleet_batches_published"`
	Held       int64             `json:"fleet_batches_dropped"`
}

// errNoHistogram is parseHistogram's answer when the metrics have no
// series of the histogram.
var errNoHistogram = errors.New("no series")

// parseHistogram reads one histogram from Prometheus text exposition. A
// histogram with labels (the gateway's is per model) is read as the sum
// of its series: buckets with the same bound add up.
func parseHistogram(r io.Reader, name string) (histogram, error) {
	var h histogram
	at := map[string]int{} // bucket index by bound as scraped
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		sp := strings.LastIndexByte(rest, ' ')
		if sp < 0 {
			continue
		}
		val := rest[sp+1:]
		n, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return h, fmt.Errorf("bad value in %q", line)
		}
		kind, labels, _ := strings.Cut(rest[:sp], "{")
		switch kind {
		case "_bucket":
			_, le, ok := strings.Cut(labels, `le="`)
			end := strings.IndexByte(le, '"')
			if !ok || end < 0 {
				return h, fmt.Errorf("bad bucket line %q", line)
			}
			le = le[:end]
			i, seen := at[le]
			if !seen {
				bound, err := strconv.ParseFloat(le, 64) // "+Inf" parses as +Inf
				if err != nil {
					return h, fmt.Errorf("bad bucket bound in %q", line)
				}
				i = len(h.Bounds)
				at[le] = i
				h.Bounds, h.LE, h.Counts = append(h.Bounds, bound), append(h.LE, le), append(h.Counts, 0)
			}
			h.Counts[i] += uint64(n)
		case "_sum":
			h.Sum += n
		case "_count":
			h.Count += uint64(n)
		}
	}
	if err := sc.Err(); err != nil {
		return h, err
	}
	if len(h.Bounds) == 0 {
		return h, fmt.Errorf("no %s histogram in the metrics: %w", name, errNoHistogram)
	}
	return h, nil
}

// minus is the histogram of the observations made since old.
func (h histogram) minus(old histogram) histogram {
	out := histogram{Bounds: h.Bounds, LE: h.LE, Counts: make([]uint64, len(h.Counts)), Count: h.Count - old.Count, Sum: h.Sum - old.Sum}
	copy(out.Counts, h.Counts)
	if len(old.Counts) == len(h.Counts) {
		for i := range out.Counts {
			out.Counts[i] -= old.Counts[i]
		}
	}
	return out
}

// quantile estimates the q-quantile as Prometheus's histogram_quantile
// does (linear within the bucket) and returns the bucket's bounds too, so a
// report can say how precise the figure is. A quantile in the +Inf bucket
// is given as the last finite bound, with hi = +Inf.
func (h histogram) quantile(q float64) (v, lo, hi float64) {
	if len(h.Counts) == 0 {
		return math.NaN(), 0, 0
	}
	total := h.Counts[len(h.Counts)-1]
	if total == 0 {
		return math.NaN(), 0, 0
	}
	rank := q * float64(total)
	var prevCount uint64
	prevBound := 0.0
	for i, c := range h.Counts {
		if float64(c) >= rank && c > prevCount {
			b := h.Bounds[i]
			if math.IsInf(b, 1) {
				return prevBound, prevBound, b
			}
			return prevBound + (b-prevBound)*(rank-float64(prevCount))/float64(c-prevCount), prevBound, b
		}
		prevCount, prevBound = c, h.Bounds[i]
	}
	return prevBound, prevBound, math.Inf(1)
}

// getJSON decodes a GET answer.
func getJSON(client *http.Client, url string, v any) error {
	res, err := client.Get(url)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: status %d", url, res.StatusCode)
	}
	return json.NewDecoder(res.Body).Decode(v)
}

// take reads the gateway (admin base URL) and, if fleet is set, the fleet.
func take(client *http.Client, admin, fleet string) (snapshot, error) {
	s := snapshot{Time: time.Now()}
	var gw struct {
		Workers     int               `json:"workers"`
		Schedulable int               `json:"schedulable_workers"`
		Events      map[string]uint64 `json:"kv_events"`
	}
	if err := getJSON(client, admin+"/kv_router/stats", &gw); err != nil {
		return s, err
	}
	s.Workers, s.Scheduled, s.Events = gw.Workers, gw.Schedulable, gw.Events
	if s.Events == nil {
		return s, errors.New("the gateway does not follow KV events (use_kv_events is off)")
	}
	res, err := client.Get(admin + "/metrics")
	if err != nil {
		return s, err
	}
	s.Selection, err = parseHistogram(res.Body, selectionMetric)
	res.Body.Close()
	if errors.Is(err, errNoHistogram) {
		// A gateway that has not selected yet: the histogram is labelled
		// by model, so it has no series before its first observation.
		err = nil
	}
	if err != nil {
		return s, err
	}
	if fleet == "" {
		return s, nil
	}
	var fs struct {
		Ranks      int `json:"ranks"`
		Subscribed int `json:"subscribed_ranks"`
		Totals     struct {
			Published int64 `json:"batches_published"`
			Dropped   int64 `json:"batches_dropped"`
		} `json:"totals"`
	}
	if err := getJSON(client, fleet+"/stats", &fs); err != nil {
		return s, err
	}
	s.FleetRanks, s.Subscribed, s.Published, s.Held = fs.Ranks, fs.Subscribed, fs.Totals.Published, fs.Totals.Dropped
	return s, nil
}

// streamReport is the KV-event stream's health over a run.
type streamReport struct {
	Published   int64   `json:"fleet_batches_published"`
	Received    uint64  `json:"received_live"`
	Replayed    uint64  `json:"replayed"`
	Gaps        uint64  `json:"gaps"`
	Lost        uint64  `json:"lost"`
	Restarts    uint64  `json:"restarts"`
	Malformed   uint64  `json:"malformed"`
	Stale       uint64  `json:"stale"`
	Rejected    uint64  `json:"rejected"`
	CaughtUp    bool    `json:"caught_up"`
	CatchUpSecs float64 `json:"catch_up_s"`
}

// selectionReport is the selection latency over a run, in milliseconds,
// with the bucket each quantile fell in.
type selectionReport struct {
	Count  uint64  `json:"selections"`
	MeanMs float64 `json:"mean_ms"`
	P50Ms  float64 `json:"p50_ms"`
	P50In  bucket  `json:"p50_bucket_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P99In  bucket  `json:"p99_bucket_ms"`
}

// bucket is a histogram bucket's (lower, upper] bounds; an open upper
// bound is null in JSON, which has no infinity.
type bucket [2]float64

// MarshalJSON writes [lo, hi] or [lo, null].
func (b bucket) MarshalJSON() ([]byte, error) {
	hi := "null"
	if !math.IsInf(b[1], 1) {
		hi = strconv.FormatFloat(b[1], 'g', -1, 64)
	}
	return []byte("[" + strconv.FormatFloat(b[0], 'g', -1, 64) + "," + hi + "]"), nil
}

// scaleReport is what `kvbench stats --since` prints and writes.
type scaleReport struct {
	Run       *summary        `json:"run,omitempty"`
	MeanISL   float64         `json:"mean_isl_tokens,omitempty"`
	Selection selectionReport `json:"selection"`
	Events    streamReport    `json:"kv_events"`
}

// whole says whether the stream lost nothing: no gap, no loss, no
// restart, nothing malformed, and (with a fleet) every published batch
// received live.
func (r *streamReport) whole(withFleet bool) bool {
	return r.Gaps == 0 && r.Lost == 0 && r.Restarts == 0 && r.Malformed == 0 && (!withFleet || r.CaughtUp)
}

func report(before, after snapshot, withFleet bool, caughtUp time.Duration, ok bool) scaleReport {
	var r scaleReport
	d := after.Selection.minus(before.Selection)
	r.Selection.Count = d.Count
	if d.Count > 0 {
		r.Selection.MeanMs = d.Sum / float64(d.Count) * 1e3
	}
	v, lo, hi := d.quantile(.5)
	r.Selection.P50Ms, r.Selection.P50In = v*1e3, bucket{lo * 1e3, hi * 1e3}
	v, lo, hi = d.quantile(.99)
	r.Selection.P99Ms, r.Selection.P99In = v*1e3, bucket{lo * 1e3, hi * 1e3}
	ev := func(k string) uint64 { return after.Events[k] - before.Events[k] }
	r.Events = streamReport{Received: ev("messages"), Replayed: ev("replayed"), Gaps: ev("gaps"), Lost: ev("lost"),
		Restarts: ev("restarts"), Malformed: ev("malformed"), Stale: ev("stale"), Rejected: ev("rejected")}
	if withFleet {
		r.Events.Published = after.Published - before.Published
		r.Events.CaughtUp, r.Events.CatchUpSecs = ok, caughtUp.Seconds()
	}
	return r
}

// ms renders a duration in milliseconds with sensible precision.
func ms(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "∞"
	case v < 1:
		return strconv.FormatFloat(v, 'f', 3, 64)
	case v < 100:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

func (r *scaleReport) print(w io.Writer, withFleet bool) {
	if s := r.Run; s != nil {
		fmt.Fprintf(w, "requests %d, errors %d, %.1f req/s over %.0f s; TTFT p50 %s ms, p99 %s ms; prefix hit ratio %.3f; mean ISL %.0f tokens\n",
			s.Requests, s.Errors, s.ReqPerSec, s.Seconds, ms(s.TTFTms.P50), ms(s.TTFTms.P99), s.HitRatio, r.MeanISL)
		if s.CPUPerReqMs > 0 {
			fmt.Fprintf(w, "gateway CPU per request: %.2f ms (user+system from /proc over the run, divided by the completed requests)\n", s.CPUPerReqMs)
		}
	}
	sel := &r.Selection
	fmt.Fprintf(w, "selection latency (%s, buckets 26%% apart): %d selections, mean %s ms, p50 %s ms (bucket %s–%s), p99 %s ms (bucket %s–%s)\n",
		selectionMetric, sel.Count, ms(sel.MeanMs), ms(sel.P50Ms), ms(sel.P50In[0]), ms(sel.P50In[1]), ms(sel.P99Ms), ms(sel.P99In[0]), ms(sel.P99In[1]))
	e := &r.Events
	if withFleet {
		fmt.Fprintf(w, "KV events: the fleet published %d batches, the gateway received %d live", e.Published, e.Received)
		if e.CaughtUp {
			fmt.Fprintf(w, " (all of them %.1f s after the last request)", e.CatchUpSecs)
		} else {
			fmt.Fprintf(w, " (%d missing %.0f s after the last request)", e.Published-int64(e.Received), e.CatchUpSecs)
		}
	} else {
		fmt.Fprintf(w, "KV events: the gateway received %d batches live", e.Received)
	}
	fmt.Fprintf(w, ", replayed %d; gaps %d, lost %d, restarts %d, malformed %d, stale %d, rejected events %d\n",
		e.Replayed, e.Gaps, e.Lost, e.Restarts, e.Malformed, e.Stale, e.Rejected)
}

// runStats is `kvbench stats`.
func runStats(args []string) error {
	fs := flag.NewFlagSet("stats", flag.ExitOnError)
	admin := fs.String("admin", "http://127.0.0.1:2019", "the gateway's Caddy admin base URL")
	fleet := fs.String("fleet", "", "kvmock's admin base URL, to compare what it published with what the gateway received")
	ready := fs.Int("ready", 0, "wait until this many workers are schedulable and followed (and, with --fleet, subscribed to)")
	save := fs.String("save", "", "write the current counters to this file")
	since := fs.String("since", "", "report the changes since the counters in this file")
	runFile := fs.String("run", "", "with --since: kvbench run's --json output, to report with")
	jsonOut := fs.String("json", "", "with --since: write the report as JSON to this file")
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for --ready, or for the gateway to receive every published batch")
	check := fs.Bool("check", false, "with --since: exit 1 unless the event stream was whole (no gap, loss or restart, every batch received)")
	_ = fs.Parse(args)
	client := &http.Client{Timeout: 30 * time.Second}
	switch {
	case *ready > 0:
		return waitReady(client, *admin, *fleet, *ready, *wait)
	case *save != "":
		s, err := take(client, *admin, *fleet)
		if err != nil {
			return err
		}
		b, err := json.MarshalIndent(s, "", "  ")
		if err != nil {
			return err
		}
		return os.WriteFile(*save, b, 0o644)
	case *since == "":
		return errors.New("stats: give --ready N, --save FILE or --since FILE")
	}
	var before snapshot
	b, err := os.ReadFile(*since)
	if err == nil {
		err = json.Unmarshal(b, &before)
	}
	if err != nil {
		return err
	}
	for _, le := range before.Selection.LE {
		b, err := strconv.ParseFloat(le, 64)
		if err != nil {
			return fmt.Errorf("%s: bucket bound %q", *since, le)
		}
		before.Selection.Bounds = append(before.Selection.Bounds, b)
	}
	withFleet := *fleet != ""
	// caughtUp: the gateway has received live every batch the fleet
	// published since before (always, without a fleet to compare with).
	caughtUp := func(after snapshot) bool {
		return !withFleet || int64(after.Events["messages"]-before.Events["messages"]) >= after.Published-before.Published
	}
	start := time.Now()
	after, err := take(client, *admin, *fleet)
	for err == nil && !caughtUp(after) && time.Since(start) < *wait {
		time.Sleep(100 * time.Millisecond)
		after, err = take(client, *admin, *fleet)
	}
	if err != nil {
		return err
	}
	r := report(before, after, withFleet, time.Since(start), caughtUp(after))
	if *runFile != "" {
		var sums []summary
		b, err := os.ReadFile(*runFile)
		if err == nil {
			err = json.Unmarshal(b, &sums)
		}
		if err != nil {
			return fmt.Errorf("--run: %w", err)
		}
		if len(sums) > 0 {
			r.Run = &sums[0]
			if n := r.Run.Requests; n > 0 {
				r.MeanISL = float64(r.Run.PromptTokens) / float64(n)
			}
		}
	}
	r.print(os.Stdout, withFleet)
	if *jsonOut != "" {
		b, err := json.MarshalIndent(r, "", "  ")
		if err == nil {
			err = os.WriteFile(*jsonOut, b, 0o644)
		}
		if err != nil {
			return err
		}
	}
	if *check && !r.Events.whole(withFleet) {
		return errors.New("the KV-event stream was not whole")
	}
	return nil
}

// waitReady polls until n workers are schedulable, n listeners run and,
// with a fleet, n of its ranks have a subscriber.
func waitReady(client *http.Client, admin, fleet string, n int, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	last := ""
	for {
		s, err := take(client, admin, fleet)
		if err == nil {
			state := fmt.Sprintf("%d workers, %d schedulable, %d KV-event listeners", s.Workers, s.Scheduled, s.Events["listeners"])
			if fleet != "" {
				state += fmt.Sprintf(", %d of the fleet's %d ranks subscribed to", s.Subscribed, s.FleetRanks)
			}
			if s.Scheduled >= n && int(s.Events["listeners"]) >= n && (fleet == "" || s.Subscribed >= n) {
				fmt.Println("ready:", state)
				return nil
			}
			last = state
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %s", wait, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
