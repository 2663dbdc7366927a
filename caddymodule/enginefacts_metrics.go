package caddymodule

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// The engine facts' metrics (docs/engine-facts.md): how the readings go,
// and which workers are routed by load only because their engine runs
// another block size than they were declared with.

var (
	engineReadsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_engine_facts_reads_total",
		Help: "Readings of the workers' engines (GET /v1/models and /metrics), by outcome: ok, partial (one of the two answered) or failed.",
	}, []string{"outcome"})
	blockSizeMismatch = prometheus.NewDesc("kvrouter_worker_block_size_mismatch",
		"1 for each worker whose engine runs another block size than the worker was declared with; it is routed by load only, its cache not credited.",
		[]string{"worker_id"}, nil)
)

// engineFactsCollector reports the engine facts' metrics: the readings'
// counter, and the mismatched workers read from the pooled router's
// catalog at scrape time, so the gauge follows the catalog across reloads.
type engineFactsCollector struct{}

func (engineFactsCollector) Describe(ch chan<- *prometheus.Desc) {
	engineReadsTotal.Describe(ch)
	ch <- blockSizeMismatch
}

func (engineFactsCollector) Collect(ch chan<- prometheus.Metric) {
	engineReadsTotal.Collect(ch)
	state := runningState()
	if state == nil {
		return
	}
	for _, rec := range state.router.Catalog().ListWorkers("", "") {
		if rec.BlockSize != nil && rec.EngineBlockSize != nil && *rec.BlockSize != *rec.EngineBlockSize {
			ch <- prometheus.MustNewConstMetric(blockSizeMismatch, prometheus.GaugeValue, 1, strconv.FormatUint(rec.WorkerID, 10))
		}
	}
}
