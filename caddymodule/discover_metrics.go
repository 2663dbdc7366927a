package caddymodule

import "github.com/prometheus/client_golang/prometheus"

// DNS discovery's metrics (docs/discovery.md). The name label is a name
// the config follows (lower-cased, without its trailing dot), so the
// series are bounded by the config, not by what DNS answers.

var (
	discoveryResolutions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_discovery_resolutions_total",
		Help: "Resolutions of the discovered names, by name and outcome: ok, empty (the name has no records: its workers leave), failed (no answer: its workers stay).",
	}, []string{"name", "outcome"})
	discoverySkipped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_discovery_skipped_total",
		Help: "Servers a name's answer gave that did not become workers, by name and reason: over_max_workers (past the name's bound), refused (the catalog refused the worker), taken (its id or endpoint belongs to a worker discovery did not create), address (unspecified, link-local, multicast, broadcast or reserved), target_failed (an SRV target whose lookup failed: its workers stay). Counted at each refresh.",
	}, []string{"name", "reason"})
	discoveryChanges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_discovery_changes_total",
		Help: "Catalog writes made by discovery, by name and change: added, updated, removed.",
	}, []string{"name", "change"})
	discoveredWorkersDesc = prometheus.NewDesc("kvrouter_discovered_workers",
		"Workers in the catalog that discovery created, by the name they were found under.",
		[]string{"name"}, nil)
)

// discoveryCollector reports discovery's counters and the workers per
// name, read from the ledgers at scrape time.
type discoveryCollector struct{}

func (discoveryCollector) Describe(ch chan<- *prometheus.Desc) {
	discoveryResolutions.Describe(ch)
	discoverySkipped.Describe(ch)
	discoveryChanges.Describe(ch)
	ch <- discoveredWorkersDesc
}

func (discoveryCollector) Collect(ch chan<- prometheus.Metric) {
	discoveryResolutions.Collect(ch)
	discoverySkipped.Collect(ch)
	discoveryChanges.Collect(ch)
	for name, n := range discoveredCounts() {
		ch <- prometheus.MustNewConstMetric(discoveredWorkersDesc, prometheus.GaugeValue, float64(n), name)
	}
}
