package caddymodule

import (
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/caddy-kvrouter/indexer"
	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Metrics on Caddy's registry, prefixed kvrouter_. The values live in the
// pooled router state (its index and listeners), so one collector reads
// them at scrape time and they carry on across reloads.

// eventMetric is one counter or gauge read from the pooled state.
type eventMetric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(s *routerState) float64
}

func counter(name, help string, value func(s *routerState) float64) eventMetric {
	return eventMetric{prometheus.NewDesc("kvrouter_"+name, help, nil, nil), prometheus.CounterValue, value}
}

func gauge(name, help string, value func(s *routerState) float64) eventMetric {
	return eventMetric{prometheus.NewDesc("kvrouter_"+name, help, nil, nil), prometheus.GaugeValue, value}
}

// kvEventCounters are the KV-event listeners' counters, each under one
// name in /kv_router/stats ("messages") and in the metrics
// (kvrouter_kv_events_messages_total).
var kvEventCounters = []struct {
	name, help string
	of         func(*indexer.Stats) *atomic.Uint64
}{
	{"messages", "KV-event messages received live from worker publishers.", func(s *indexer.Stats) *atomic.Uint64 { return &s.Messages }},
	{"batches", "KV-event batches applied to the index, live or replayed.", func(s *indexer.Stats) *atomic.Uint64 { return &s.Batches }},
	{"malformed", "KV-event frames or payloads that could not be decoded and were skipped.", func(s *indexer.Stats) *atomic.Uint64 { return &s.Malformed }},
	{"stale", "KV-event messages dropped as duplicates of sequences already applied.", func(s *indexer.Stats) *atomic.Uint64 { return &s.Stale }},
	{"gaps", "Gaps in publishers' sequence numbers, late joins included.", func(s *indexer.Stats) *atomic.Uint64 { return &s.Gaps }},
	{"replays", "Replay requests made to publishers' replay endpoints.", func(s *indexer.Stats) *atomic.Uint64 { return &s.Replays }},
	{"replayed", "KV-event batches recovered by replay.", func(s *indexer.Stats) *atomic.Uint64 { return &s.Replayed }},
	{"lost", "KV-event batches missed and not recovered.", func(s *indexer.Stats) *atomic.Uint64 { return &s.Lost }},
	{"restarts", "Publisher restarts detected (sequence went back); the rank's blocks were dropped.", func(s *indexer.Stats) *atomic.Uint64 { return &s.Restarts }},
	{"rejected", "KV events the index refused, such as stores whose parent block it does not hold.", func(s *indexer.Stats) *atomic.Uint64 { return &s.Rejected }},
	{"jumps", "Publisher sequence jumps past kv_events_max_gap, taken as restarts (the rank's blocks were dropped), not as lost events.", func(s *indexer.Stats) *atomic.Uint64 { return &s.Jumps }},
	{"unknown_rank", "KV-event batches dropped because their dp_rank is not one of the worker's ranks.", func(s *indexer.Stats) *atomic.Uint64 { return &s.UnknownRank }},
	{"disconnects", "Publisher connections dropped (an oversized message, or the publisher went away) and dialed again.", func(s *indexer.Stats) *atomic.Uint64 { return &s.Disconnects }},
}

var eventMetrics = append(kvEventMetrics(),
	gauge("kv_event_listeners", "Per-rank KV-event listeners running.",
		func(s *routerState) float64 { return float64(s.events.Listeners()) }),
	gauge("index_entries", "(block, worker rank) entries in the KV index.",
		func(s *routerState) float64 { return float64(s.events.Index.Entries()) }),
	counter("index_full_total", "Blocks stored while the KV index was at its bound (each evicted an older entry).",
		func(s *routerState) float64 { return float64(s.events.Index.Full.Load()) }),
	counter("index_evicted_total", "KV index entries evicted, oldest first, to keep the index within index_max_memory.",
		func(s *routerState) float64 { return float64(s.events.Index.Evicted.Load()) }),
	counter("index_unknown_blocks_total", "Removals of blocks the index did not hold for that rank.",
		func(s *routerState) float64 { return float64(s.events.Index.UnknownBlock.Load()) }),
)

// kvEventMetrics is a counter for each of kvEventCounters.
func kvEventMetrics() []eventMetric {
	out := make([]eventMetric, 0, len(kvEventCounters))
	for _, c := range kvEventCounters {
		out = append(out, counter("kv_events_"+c.name+"_total", c.help,
			func(s *routerState) float64 { return float64(c.of(&s.events.Stats).Load()) }))
	}
	return out
}

// eventCollector reports eventMetrics for the pooled router, if it runs in
// event mode.
type eventCollector struct{}

func (eventCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range eventMetrics {
		ch <- m.desc
	}
	ch <- activeReservations
	ch <- workerIndexBlocks
}

func (eventCollector) Collect(ch chan<- prometheus.Metric) {
	state := runningState()
	if state == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(activeReservations, prometheus.GaugeValue, float64(state.router.ActiveReservations()))
	if state.events == nil {
		return
	}
	for _, m := range eventMetrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(state))
	}
	for _, rec := range state.router.ListWorkers("", "") {
		for _, rk := range rec.Ranks() {
			n := state.events.Index.Blocks(rec.Partition(), rk)
			ch <- prometheus.MustNewConstMetric(workerIndexBlocks, prometheus.GaugeValue, float64(n),
				strconv.FormatUint(rk.WorkerID, 10), strconv.FormatUint(uint64(rk.DPRank), 10))
		}
	}
}

// registerMetrics adds the collector to a config's registry; a registry
// that already has it (the same config provisioned twice) is fine.
func registerMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{eventCollector{}, requestsTotal, selectionSeconds,
		promptTokensTotal, cachedTokensTotal, tokenizeFailures, failoversTotal} {
		err := reg.Register(c)
		var are prometheus.AlreadyRegisteredError
		if err != nil && !errors.As(err, &are) {
			return err
		}
	}
	return nil
}

// Proxy-path metrics: package-level, so they carry on across reloads.
var (
	requestsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_requests_total",
		Help: "Requests seen by the kv_router handler, by outcome (routed: a worker was reserved; unrouted: left to the fallback policy) and routing mode (kv: by prompt tokens; load: no tokens could be had).",
	}, []string{"outcome", "mode"})
	selectionSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "kvrouter_selection_duration_seconds",
		Help: "Time to select and reserve a worker for a request: hashing, index lookup, scoring and booking.",
		// Ten buckets per decade from 10 µs to 10 s (each 26% wider than
		// the last), so that a quantile read from them is within a bucket
		// of a quarter; under overload the time includes waiting for the
		// router's locks, hence the long tail.
		Buckets: prometheus.ExponentialBucketsRange(10e-6, 10, 61),
	})
	promptTokensTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvrouter_prompt_tokens_total",
		Help: "Prompt tokens of routed requests.",
	})
	cachedTokensTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvrouter_cached_tokens_total",
		Help: "Prompt tokens already cached on the chosen worker; divided by kvrouter_prompt_tokens_total, the prefix hit ratio.",
	})
	tokenizeFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvrouter_tokenize_failures_total",
		Help: "Calls to a worker's /tokenize that failed or timed out; those requests were routed by load.",
	})
	failoversTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvrouter_failovers_total",
		Help: "Reservations moved to another worker because reverse_proxy could not use the chosen one.",
	})
	activeReservations = prometheus.NewDesc("kvrouter_active_reservations",
		"Reservations held by requests in flight and by selection API clients.", nil, nil)
	workerIndexBlocks = prometheus.NewDesc("kvrouter_worker_index_blocks",
		"Blocks the KV index holds for each worker rank.", []string{"worker_id", "dp_rank"}, nil)
)

func observeSelection(resp *selection.SelectResponse, promptTokens int, mode string, took time.Duration) {
	requestsTotal.WithLabelValues("routed", mode).Inc()
	selectionSeconds.Observe(took.Seconds())
	promptTokensTotal.Add(float64(promptTokens))
	cachedTokensTotal.Add(float64(min(resp.CachedTokens, uint64(promptTokens))))
}
