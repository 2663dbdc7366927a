package caddymodule

import (
	"errors"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/caddy-kvrouter/indexer"
	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Metrics on Caddy's registry, prefixed kvrouter_. The values live in the
// pooled router state (its index and listeners), so one collector reads
// them at scrape time and they carry on across reloads.

// eventMetric is one of indexer.Figures that is also a metric.
type eventMetric struct {
	desc   *prometheus.Desc
	kind   prometheus.ValueType
	figure indexer.Figure
}

// eventMetrics are the figures of indexer.Figures that have a metric name,
// as kvrouter_<name>; the same table gives /kv_router/stats its keys.
var eventMetrics = func() []eventMetric {
	var out []eventMetric
	for _, f := range indexer.Figures {
		if f.Metric == "" {
			continue
		}
		kind := prometheus.CounterValue
		if f.Gauge {
			kind = prometheus.GaugeValue
		}
		out = append(out, eventMetric{prometheus.NewDesc("kvrouter_"+f.Metric, f.Help, nil, nil), kind, f})
	}
	return out
}()

// eventCollector reports eventMetrics for the pooled router, if it runs in
// event mode.
type eventCollector struct{}

func (eventCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range eventMetrics {
		ch <- m.desc
	}
	ch <- activeReservations
	ch <- workerIndexBlocks
	ch <- kvEventsConnected
	ch <- approxIndexBytes
	ch <- approxIndexEvicted
	ch <- approxIndexRefused
}

func (eventCollector) Collect(ch chan<- prometheus.Metric) {
	state := runningState()
	if state == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(activeReservations, prometheus.GaugeValue, float64(state.router.ActiveReservations()))
	if room, ok := state.router.ApproxRoom(); ok {
		ch <- prometheus.MustNewConstMetric(approxIndexBytes, prometheus.GaugeValue, float64(room.Bytes))
		ch <- prometheus.MustNewConstMetric(approxIndexEvicted, prometheus.CounterValue, float64(room.Evicted))
		ch <- prometheus.MustNewConstMetric(approxIndexRefused, prometheus.CounterValue, float64(room.Refused))
	}
	if state.events == nil {
		return
	}
	snap := state.events.Stats()
	for _, m := range eventMetrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, float64(m.figure.Value(&snap)))
	}
	for _, rec := range state.router.Catalog().ListWorkers("", "") {
		for _, rk := range rec.Ranks() {
			n := state.events.Index.Blocks(rec.Partition(), rk)
			ch <- prometheus.MustNewConstMetric(workerIndexBlocks, prometheus.GaugeValue, float64(n),
				strconv.FormatUint(rk.WorkerID, 10), strconv.FormatUint(uint64(rk.DPRank), 10))
		}
	}
	for rk, up := range state.events.Connections() {
		v := 0.0
		if up {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(kvEventsConnected, prometheus.GaugeValue, v,
			strconv.FormatUint(rk.WorkerID, 10), strconv.FormatUint(uint64(rk.DPRank), 10))
	}
}

// registerMetrics adds the collector to a config's registry; a registry
// that already has it (the same config provisioned twice) is fine.
func registerMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	for _, c := range registeredCollectors() {
		err := reg.Register(c)
		var are prometheus.AlreadyRegisteredError
		if err != nil && !errors.As(err, &are) {
			return err
		}
	}
	return nil
}

// registeredCollectors are every collector the gateway exports.
func registeredCollectors() []prometheus.Collector {
	cs := []prometheus.Collector{eventCollector{}, requestsTotal, selectionSeconds,
		promptTokensTotal, cachedTokensTotal, tokenizeFailures, failoversTotal, ttftSeconds,
		usageReportsTotal, promptTokensMismatch, predictedCachedTotal, reportedCachedTotal,
		cachedPredictionError, predictionAccuracy, tokenizeCacheTotal, engineFactsCollector{}, discoveryCollector{},
		takenOutCollector{}, contextFiltered, modelLabelPruner{}}
	cs = append(cs, selectTimingCollectors...)
	return append(cs, overloadCollectors()...)
}

// Proxy-path metrics: package-level, so they carry on across reloads. The
// model label is the partition's model (or "" for a model no worker
// serves), bounded and pruned as modellabels.go says.
var (
	requestsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_requests_total",
		Help: "Requests seen by the kv_router handler, by model, outcome (routed: a worker was reserved; refused: a served model none of whose workers could take it; unknown_model: no worker serves the model) and routing mode (kv: by prompt tokens; load: no tokens could be had).",
	}, []string{"model", "outcome", "mode"})
	selectionSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "kvrouter_selection_duration_seconds",
		Help: "Time to select and reserve a worker for a request: hashing, index lookup, scoring and booking.",
		// Ten buckets per decade from 10 µs to 10 s (each 26% wider than
		// the last), so that a quantile read from them is within a bucket
		// of a quarter; under overload the time includes waiting for the
		// router's locks, hence the long tail.
		Buckets: prometheus.ExponentialBucketsRange(10e-6, 10, 61),
	}, []string{"model"})
	promptTokensTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_prompt_tokens_total",
		Help: "Prompt tokens of routed requests.",
	}, []string{"model"})
	cachedTokensTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_cached_tokens_total",
		Help: "Prompt tokens already cached on the chosen worker, as the gateway predicted at selection; divided by kvrouter_prompt_tokens_total, the prefix hit ratio.",
	}, []string{"model"})
	ttftSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "kvrouter_ttft_seconds",
		Help: "Time to first token as the gateway measures it: from the request's arrival at the kv_router handler to the first byte of the worker's answer sent to the client (body read, tokenizing, selection and the worker's queue and prefill included).",
		// Ten buckets per decade from 1 ms to 10 min.
		Buckets: prometheus.ExponentialBucketsRange(1e-3, 600, 58),
	}, []string{"model"})
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
	approxIndexBytes = prometheus.NewDesc("kvrouter_approx_index_bytes",
		"The approximate index's heap, estimated (use_kv_events off); bounded by a third of index_max_memory.", nil, nil)
	approxIndexEvicted = prometheus.NewDesc("kvrouter_approx_index_evicted_total",
		"(block, worker rank) holds the approximate index dropped before approx_ttl to stay within its bound, those soonest to expire first.", nil, nil)
	approxIndexRefused = prometheus.NewDesc("kvrouter_approx_index_refused_total",
		"(block, worker rank) holds the approximate index did not record: a booking larger than its whole bound.", nil, nil)
	workerIndexBlocks = prometheus.NewDesc("kvrouter_worker_index_blocks",
		"Blocks the KV index holds for each worker rank.", []string{"worker_id", "dp_rank"}, nil)
	kvEventsConnected = prometheus.NewDesc("kvrouter_kv_events_connected",
		"1 while a worker rank's KV-event publisher is connected, 0 while it is not (an engine that died while idle publishes nothing, so only this tells it from an idle one); connect mode only.", []string{"worker_id", "dp_rank"}, nil)
)

func observeSelection(resp *selection.SelectResponse, promptTokens int, mode string, took time.Duration) {
	model := modelLabels.of(resp.ModelName)
	requestsTotal.WithLabelValues(model, "routed", mode).Inc()
	selectionSeconds.WithLabelValues(model).Observe(took.Seconds())
	promptTokensTotal.WithLabelValues(model).Add(float64(promptTokens))
	cachedTokensTotal.WithLabelValues(model).Add(float64(min(resp.CachedTokens, uint64(promptTokens))))
}
