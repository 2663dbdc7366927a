package caddymodule

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvrouter/caddy-kvrouter/indexer"
)

// testCounter reads a counter's current value.
func testCounter(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

// TestMetricNamesAndStatsKeys pins the names that dashboards and scripts
// read: the kvrouter_* metrics and the /kv_router/stats keys rendered from
// indexer.Figures.
func TestMetricNamesAndStatsKeys(t *testing.T) {
	counters := []string{"messages", "batches", "malformed", "stale", "gaps", "replays", "replayed", "lost",
		"restarts", "rejected", "jumps", "unknown_rank", "disconnects", "behind", "cut", "turned_away", "wrong_topic",
		"dial_failures"}
	want := map[string]prometheus.ValueType{
		"kvrouter_kv_event_listeners":         prometheus.GaugeValue,
		"kvrouter_index_entries":              prometheus.GaugeValue,
		"kvrouter_index_full_total":           prometheus.CounterValue,
		"kvrouter_index_evicted_total":        prometheus.CounterValue,
		"kvrouter_index_unknown_blocks_total": prometheus.CounterValue,
	}
	for _, c := range counters {
		want["kvrouter_kv_events_"+c+"_total"] = prometheus.CounterValue
	}
	got := map[string]prometheus.ValueType{}
	for _, m := range eventMetrics {
		got["kvrouter_"+m.figure.Metric] = m.kind
		if !strings.Contains(m.desc.String(), `"kvrouter_`+m.figure.Metric+`"`) {
			t.Errorf("desc %s does not carry kvrouter_%s", m.desc, m.figure.Metric)
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("metrics %v, want %v", got, want)
	}
	keys := map[string][]string{
		"kv_events": append([]string{"listeners"}, counters...),
		"index": {"entries", "full", "applied", "skipped", "unknown_parent", "token_count_mismatch",
			"unknown_block", "evicted", "max_entries"},
	}
	seen := map[string][]string{}
	for _, f := range indexer.Figures {
		seen[f.Section] = append(seen[f.Section], f.Key)
	}
	for sec, ks := range keys {
		if !slices.Equal(slices.Sorted(slices.Values(seen[sec])), slices.Sorted(slices.Values(ks))) {
			t.Errorf("section %s keys %v, want %v", sec, seen[sec], ks)
		}
	}
	if len(seen) != len(keys) {
		t.Errorf("sections %v", slices.Collect(maps.Keys(seen)))
	}
}

// TestStatsFiguresReadTheSnapshot: each /kv_router/stats figure reads its
// own field of a snapshot (a table row wired to the wrong field would show
// here).
func TestStatsFiguresReadTheSnapshot(t *testing.T) {
	s := indexer.Snapshot{Listeners: 1,
		Events: indexer.EventCounts{Messages: 2, Batches: 3, Malformed: 4, Stale: 5, Gaps: 6, Replays: 7, Replayed: 8,
			Lost: 9, Restarts: 10, Rejected: 11, Jumps: 12, UnknownRank: 13, Disconnects: 14, Behind: 24,
			Cut: 25, TurnedAway: 26, WrongTopic: 27, DialFailures: 28},
		Index: indexer.IndexCounts{Entries: 15, MaxEntries: 16, Applied: 17, Skipped: 18, UnknownParent: 19,
			UnknownBlock: 20, TokenCount: 21, Full: 22, Evicted: 23}}
	want := map[string]uint64{"kv_events.listeners": 1, "kv_events.messages": 2, "kv_events.batches": 3,
		"kv_events.malformed": 4, "kv_events.stale": 5, "kv_events.gaps": 6, "kv_events.replays": 7,
		"kv_events.replayed": 8, "kv_events.lost": 9, "kv_events.restarts": 10, "kv_events.rejected": 11,
		"kv_events.jumps": 12, "kv_events.unknown_rank": 13, "kv_events.disconnects": 14, "kv_events.behind": 24,
		"kv_events.cut": 25, "kv_events.turned_away": 26, "kv_events.wrong_topic": 27,
		"kv_events.dial_failures": 28, "index.entries": 15, "index.max_entries": 16, "index.applied": 17, "index.skipped": 18,
		"index.unknown_parent": 19, "index.unknown_block": 20, "index.token_count_mismatch": 21,
		"index.full": 22, "index.evicted": 23}
	got := map[string]uint64{}
	for sec, figures := range statsSections(s) {
		for k, v := range figures {
			got[sec+"."+k] = v
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("figures %v, want %v", got, want)
	}
}
