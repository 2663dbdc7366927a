package main

import (
	"errors"
	"math"
	"strings"
	"testing"
)

const metricsText = `# HELP kvrouter_selection_duration_seconds Time to select.
# TYPE kvrouter_selection_duration_seconds histogram
kvrouter_selection_duration_seconds_bucket{le="0.001"} 10
kvrouter_selection_duration_seconds_bucket{le="0.002"} 60
kvrouter_selection_duration_seconds_bucket{le="0.004"} 98
kvrouter_selection_duration_seconds_bucket{le="+Inf"} 100
kvrouter_selection_duration_seconds_sum 0.25
kvrouter_selection_duration_seconds_count 100
kvrouter_selection_duration_seconds_other 7
kvrouter_requests_total{mode="kv",outcome="routed"} 100
`

func TestHistogramQuantiles(t *testing.T) {
	h, err := parseHistogram(strings.NewReader(metricsText), selectionMetric)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Bounds) != 4 || !math.IsInf(h.Bounds[3], 1) || h.Count != 100 || h.Sum != 0.25 {
		t.Fatalf("parsed %+v", h)
	}
	for _, c := range []struct {
		q, want, lo, hi float64
	}{
		{0.05, 0.0005, 0, 0.001},          // inside the first bucket, from 0
		{0.5, 0.0018, 0.001, 0.002},       // 40 of 50 into (1 ms, 2 ms]
		{0.98, 0.004, 0.002, 0.004},       // the top of a bucket
		{0.99, 0.004, 0.004, math.Inf(1)}, // past the last finite bound: that bound, open above
	} {
		v, lo, hi := h.quantile(c.q)
		if math.Abs(v-c.want) > 1e-12 || lo != c.lo || hi != c.hi {
			t.Errorf("q%.2f = %v in (%v, %v]; want %v in (%v, %v]", c.q, v, lo, hi, c.want, c.lo, c.hi)
		}
	}
	// Only what happened since the earlier scrape counts.
	old := histogram{Bounds: h.Bounds, Counts: []uint64{10, 50, 50, 50}, Count: 50, Sum: 0.05}
	d := h.minus(old)
	if d.Count != 50 || d.Counts[0] != 0 || d.Counts[3] != 50 {
		t.Fatalf("difference %+v", d)
	}
	if v, lo, _ := d.quantile(0.1); lo != 0.001 || math.Abs(v-0.0015) > 1e-12 { // 5 of the 10 in (1 ms, 2 ms]
		t.Fatalf("q0.10 of the difference = %v (bucket from %v)", v, lo)
	}
	if v, _, _ := (histogram{}).quantile(0.5); !math.IsNaN(v) {
		t.Fatalf("an empty histogram has quantile %v", v)
	}
	if _, err := parseHistogram(strings.NewReader("x 1\n"), selectionMetric); !errors.Is(err, errNoHistogram) {
		t.Fatal("a missing histogram must be an error")
	}
}

// A histogram labelled by model is read as the sum of its series.
func TestHistogramSumsSeries(t *testing.T) {
	text := `kvrouter_selection_duration_seconds_bucket{model="a",le="0.001"} 1
kvrouter_selection_duration_seconds_bucket{model="a",le="+Inf"} 2
kvrouter_selection_duration_seconds_sum{model="a"} 0.5
kvrouter_selection_duration_seconds_count{model="a"} 2
kvrouter_selection_duration_seconds_bucket{model="b",le="0.001"} 3
kvrouter_selection_duration_seconds_bucket{model="b",le="+Inf"} 5
kvrouter_selection_duration_seconds_sum{model="b"} 1.5
kvrouter_selection_duration_seconds_count{model="b"} 5
`
	h, err := parseHistogram(strings.NewReader(text), selectionMetric)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Bounds) != 2 || h.Counts[0] != 4 || h.Counts[1] != 7 || h.Count != 7 || h.Sum != 2 {
		t.Fatalf("parsed %+v", h)
	}
}

func TestStreamWhole(t *testing.T) {
	for _, c := range []struct {
		r     streamReport
		fleet bool
		want  bool
	}{
		{streamReport{Published: 5, Received: 5, CaughtUp: true}, true, true},
		{streamReport{Published: 5, Received: 4}, true, false},
		{streamReport{Received: 4}, false, true},
		{streamReport{Published: 5, Received: 5, CaughtUp: true, Gaps: 1}, true, false},
		{streamReport{Published: 5, Received: 5, CaughtUp: true, Lost: 1}, true, false},
		{streamReport{Published: 5, Received: 5, CaughtUp: true, Restarts: 1}, true, false},
	} {
		if got := c.r.whole(c.fleet); got != c.want {
			t.Errorf("%+v (fleet %v): whole = %v", c.r, c.fleet, got)
		}
	}
}
