package caddymodule

import "github.com/prometheus/client_golang/prometheus"

// Overload metrics (docs/overload.md). The model label is a served
// partition's model: a request only waits when a served partition's
// workers are busy, so clients cannot grow the label set (and
// modellabels.go bounds and prunes it).
var (
	queueDepth = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvrouter_overload_queue_depth",
		Help: "Requests waiting in the overload queue for a worker of their model to have capacity.",
	}, []string{"model"})
	queueWaitSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "kvrouter_overload_wait_seconds",
		Help: "Time requests spent in the overload queue, by outcome (admitted: went on to a worker; shed: answered 429 or abandoned by the client).",
		// Ten buckets per decade from 1 ms to 100 s.
		Buckets: prometheus.ExponentialBucketsRange(1e-3, 100, 51),
	}, []string{"model", "outcome"})
	queueAdmittedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_overload_admitted_total",
		Help: "Requests that waited in the overload queue and then went on to a worker.",
	}, []string{"model"})
	queueShedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_overload_shed_total",
		Help: "Requests the overload queue refused with 429, by reason (queue_full, predicted_wait, deadline, closing), or lost to their client (canceled).",
	}, []string{"model", "reason"})
	workerBusyTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_worker_overloaded_total",
		Help: "Workers' overloaded answers (429, or 503 with Retry-After) that marked the worker busy rather than failed.",
	}, []string{"model"})
)

// overloadCollectors are the overload metrics, for registeredCollectors.
func overloadCollectors() []prometheus.Collector {
	return []prometheus.Collector{queueDepth, queueWaitSeconds, queueAdmittedTotal, queueShedTotal, workerBusyTotal}
}
