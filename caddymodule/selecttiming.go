package caddymodule

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Where a selection's time goes (issue 12, item 4).
// kvrouter_selection_duration_seconds is the handler's wall time around
// select-and-reserve; with thousands of requests in flight on a few cores
// it is mostly waiting. The router reports each selection's wait for its
// partition's lock apart from the rest (selection.WithSelectTiming), so a
// long selection time can be told apart: lock queueing, or the gateway's
// goroutines waiting for a CPU (which Go cannot tell from work, so it is
// in the work figure).

// selectionBuckets are ten buckets per decade from 10 µs to 10 s, as
// kvrouter_selection_duration_seconds has, so the figures compare bucket
// for bucket.
var selectionBuckets = prometheus.ExponentialBucketsRange(10e-6, 10, 61)

var (
	selectionLockWaitSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kvrouter_selection_lock_wait_seconds",
		Help:    "Time a selection spent blocked on its partition's lock (for the snapshot of the ranks' loads and for the booking).",
		Buckets: selectionBuckets,
	})
	selectionLockHeldSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kvrouter_selection_lock_held_seconds",
		Help:    "Time a selection held its partition's lock.",
		Buckets: selectionBuckets,
	})
	selectionWorkSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kvrouter_selection_work_seconds",
		Help:    "A selection's time in the router minus its wait for the partition's lock: hashing, index lookup, scoring and booking, plus any wait for a CPU among them (an upper bound on the work).",
		Buckets: selectionBuckets,
	})
	selectionRechosenTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvrouter_selection_rechosen_total",
		Help: "Selections whose pick, scored on a snapshot of the ranks' loads, no longer qualified at booking and was made again under the partition's lock.",
	})
)

// selectTimingCollectors are the metrics observeSelectTiming feeds.
var selectTimingCollectors = []prometheus.Collector{selectionLockWaitSeconds, selectionLockHeldSeconds,
	selectionWorkSeconds, selectionRechosenTotal}

// observeSelectTiming is the router's WithSelectTiming hook.
func observeSelectTiming(t selection.SelectTiming) {
	selectionLockWaitSeconds.Observe(t.LockWait.Seconds())
	selectionLockHeldSeconds.Observe(t.LockHeld.Seconds())
	selectionWorkSeconds.Observe(t.Work().Seconds())
	if t.Rechosen {
		selectionRechosenTotal.Inc()
	}
}
