package main

import (
	"math"
	"slices"
	"time"
)

// metrics measures the requests that arrive in the window [Warmup,
// Duration): the prompt tokens the engines found cached at admission (the
// hit ratio, as vLLM's prefix-cache counters report it), time to first
// token, sessions moved between workers, and the prompt tokens each worker
// computed, per time bucket.
type metrics struct {
	from, to  time.Duration
	bucketDur time.Duration
	nBuckets  int

	arrivals   int
	islSum     int64
	prompt     int64
	hits       int64
	ttft       []time.Duration
	noFirst    map[uint64]time.Duration // arrivals in the window still without a first token
	laterTurns int
	moved      int
}

func newMetrics(cfg *config) *metrics {
	m := &metrics{from: cfg.Warmup, to: cfg.Duration, nBuckets: cfg.Buckets, noFirst: make(map[uint64]time.Duration)}
	m.bucketDur = max((m.to-m.from)/time.Duration(m.nBuckets), time.Millisecond)
	return m
}

func (m *metrics) inWindow(t time.Duration) bool { return t >= m.from && t < m.to }

// bucket is the load bucket of instant t, false outside the window.
func (m *metrics) bucket(t time.Duration) (int, bool) {
	if !m.inWindow(t) {
		return 0, false
	}
	return min(int((t-m.from)/m.bucketDur), m.nBuckets-1), true
}

func (m *metrics) arrival(j *job, now time.Duration) {
	if !m.inWindow(now) {
		return
	}
	m.arrivals++
	m.islSum += int64(j.seq.PromptLen)
	m.noFirst[j.id] = now
	if j.sess != nil && j.sess.last != nil {
		m.laterTurns++
		if j.moved {
			m.moved++
		}
	}
}

func (m *metrics) admission(j *job, _ time.Duration) {
	if !m.inWindow(j.arrived) {
		return
	}
	m.prompt += int64(j.seq.PromptLen)
	m.hits += int64(j.seq.HitTokens)
}

// first records j's time to first token.
func (m *metrics) first(j *job, now time.Duration) {
	if _, ok := m.noFirst[j.id]; !ok {
		return
	}
	delete(m.noFirst, j.id)
	m.ttft = append(m.ttft, now-j.arrived)
}

// result is one policy's figures. Times are in seconds of virtual time.
type result struct {
	Policy string `json:"policy"`
	// Requests arrived in the window; Unfinished of them had no first
	// token when it closed (their TTFT counts as the time they had waited,
	// a lower bound).
	Requests   int     `json:"requests"`
	Unfinished int     `json:"unfinished"`
	MeanISL    float64 `json:"mean_isl_tokens"`
	HitRatio   float64 `json:"hit_ratio"`
	TTFTP50    float64 `json:"ttft_p50_s"`
	TTFTP90    float64 `json:"ttft_p90_s"`
	TTFTP99    float64 `json:"ttft_p99_s"`
	TTFTMean   float64 `json:"ttft_mean_s"`
	// PrefillMaxOverMean is the most prompt tokens a worker computed in the
	// window over the mean per worker.
	PrefillMaxOverMean float64 `json:"prefill_max_over_mean"`
	// MovedFraction is the share of a session's later turns placed on
	// another worker than its previous turn.
	MovedFraction float64 `json:"moved_fraction"`
	// LoadSpread is, per time bucket, the prompt tokens computed by the
	// busiest worker and the 90th percentile worker over the mean.
	LoadSpread   []spread `json:"load_spread"`
	IndexEntries int64    `json:"index_entries"`
	ApplyErrors  int64    `json:"index_apply_errors"`
	Refused      int64    `json:"refused"`
}

// spread is one bucket's load spread over the workers.
type spread struct {
	T           float64 `json:"t_s"`
	MaxOverMean float64 `json:"max_over_mean"`
	P90OverMean float64 `json:"p90_over_mean"`
}

func (m *metrics) result(s *sim) *result {
	r := &result{Requests: m.arrivals, Unfinished: len(m.noFirst), IndexEntries: s.index.Entries()}
	if m.arrivals > 0 {
		r.MeanISL = round(float64(m.islSum) / float64(m.arrivals))
	}
	if m.prompt > 0 {
		r.HitRatio = round(float64(m.hits) / float64(m.prompt))
	}
	if m.laterTurns > 0 {
		r.MovedFraction = round(float64(m.moved) / float64(m.laterTurns))
	}
	all := slices.Clone(m.ttft)
	for _, at := range m.noFirst {
		all = append(all, m.to-at)
	}
	slices.Sort(all)
	r.TTFTP50, r.TTFTP90, r.TTFTP99 = pct(all, 0.5), pct(all, 0.9), pct(all, 0.99)
	if len(all) > 0 {
		var sum time.Duration
		for _, d := range all {
			sum += d
		}
		r.TTFTMean = round(sum.Seconds() / float64(len(all)))
	}
	totals := make([]int64, len(s.workers))
	for i, w := range s.workers {
		totals[i] = w.prefill
	}
	r.PrefillMaxOverMean = maxOverMean(totals)
	for b := range m.nBuckets {
		col := make([]int64, len(s.workers))
		for i, w := range s.workers {
			col[i] = w.buckets[b]
		}
		mx, p90 := spreadOf(col)
		r.LoadSpread = append(r.LoadSpread, spread{T: round((m.from + time.Duration(b)*m.bucketDur).Seconds()), MaxOverMean: mx, P90OverMean: p90})
	}
	return r
}

// pct is the q-quantile of sorted durations, in seconds.
func pct(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return round(sorted[int(q*float64(len(sorted)-1))].Seconds())
}

func maxOverMean(v []int64) float64 {
	mx, _ := spreadOf(v)
	return mx
}

// spreadOf is the largest value and the 90th percentile over the mean.
func spreadOf(v []int64) (mx, p90 float64) {
	var sum, top int64
	for _, x := range v {
		sum += x
		top = max(top, x)
	}
	if sum == 0 {
		return 0, 0
	}
	mean := float64(sum) / float64(len(v))
	s := slices.Clone(v)
	slices.Sort(s)
	return round(float64(top) / mean), round(float64(s[int(0.9*float64(len(s)-1))]) / mean)
}

// round keeps four decimals, so that the JSON output is stable and short.
func round(x float64) float64 { return math.Round(x*1e4) / 1e4 }
