package caddymodule

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// exportedMetrics are the names of every metric the gateway registers.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	descs := make(chan *prometheus.Desc)
	go func() {
		for _, c := range registeredCollectors() {
			c.Describe(descs)
		}
		close(descs)
	}()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	names := map[string]bool{}
	for d := range descs {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			names[m[1]] = true
		}
	}
	return names
}

// Every query of the Grafana dashboard in docs/grafana names metrics the
// gateway exports: a renamed metric must not leave a panel empty.
func TestDashboardQueriesNameExportedMetrics(t *testing.T) {
	exported := exportedMetrics(t)
	b, err := os.ReadFile("../docs/grafana/kvrouter.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	metricName := regexp.MustCompile(`\b[a-z_]+_[a-z_]+\b`)
	queries, used := 0, map[string]bool{}
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			queries++
			names := 0
			for _, name := range metricName.FindAllString(target.Expr, -1) {
				if !strings.HasPrefix(name, "kvrouter_") {
					continue // a function or a label
				}
				names++
				base := name
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if trimmed, ok := strings.CutSuffix(name, suffix); ok && exported[trimmed] {
						base = trimmed
					}
				}
				if !exported[base] {
					t.Errorf("panel %q queries %s, which the gateway does not export", p.Title, name)
				}
				used[base] = true
			}
			if names == 0 {
				t.Errorf("panel %q has a query that names no kvrouter metric: %s", p.Title, target.Expr)
			}
		}
	}
	if queries < 10 {
		t.Errorf("the dashboard has %d queries", queries)
	}
	for _, must := range []string{"kvrouter_ttft_seconds", "kvrouter_prediction_accuracy_ratio", "kvrouter_prompt_tokens_mismatch_total"} {
		if !used[must] {
			t.Errorf("the dashboard does not show %s", must)
		}
	}
	var unused []string
	for name := range exported {
		if !used[name] {
			unused = append(unused, name)
		}
	}
	slices.Sort(unused)
	t.Logf("exported metrics not on the dashboard: %v", unused)
}
