package caddymodule

import (
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Workers taken out of the candidates for failing (selection.Health) are
// told to the operator: a log line when one goes out and when it comes
// back, a counter of take-outs, a gauge of those out now, taken_out in
// /kv_router/workers and taken_out_workers in /kv_router/stats. Before,
// the clients' 503s were the only sign: the catalog still listed such a
// worker schedulable, and /loads listed it too.

var (
	workersTakenOutTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_workers_taken_out_total",
		Help: "Workers taken out of the candidates after failing for worker_down_after (by: here, or a peer replica's word).",
	}, []string{"by"})
	workersTakenOut = prometheus.NewDesc("kvrouter_workers_taken_out",
		"Workers out of the candidates now, for failing; each comes back on its first 2xx to GET /health.", nil, nil)
)

// takenOutCollector exports the gauge from the running router.
type takenOutCollector struct{}

func (takenOutCollector) Describe(ch chan<- *prometheus.Desc) {
	workersTakenOutTotal.Describe(ch)
	ch <- workersTakenOut
}

func (takenOutCollector) Collect(ch chan<- prometheus.Metric) {
	workersTakenOutTotal.Collect(ch)
	if state := runningState(); state != nil {
		ch <- prometheus.MustNewConstMetric(workersTakenOut, prometheus.GaugeValue, float64(len(state.router.Health().TakenOut())))
	}
}

// healthChanged logs and counts a worker's take-out or return.
func healthChanged(logger *zap.Logger) func(id uint64, down, byPeer bool) {
	return func(id uint64, down, byPeer bool) {
		by := "here"
		if byPeer {
			by = "peer"
		}
		if down {
			workersTakenOutTotal.WithLabelValues(by).Inc()
			logger.Warn("worker taken out of the candidates: failing for worker_down_after; probed with GET /health until it answers 2xx",
				zap.Uint64("worker_id", id), zap.String("by", by))
			return
		}
		logger.Info("worker back among the candidates", zap.Uint64("worker_id", id), zap.String("by", by))
	}
}
