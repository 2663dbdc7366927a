package fidelity

import (
	"fmt"
	"testing"
)

// A hybrid model's engine (sliding-window or Mamba layers beside full
// attention: gpt-oss, Gemma 3, Qwen3-Next) publishes each KV-cache
// group's stores and removals, numbered by the group's first layer, so
// the full-attention group is group 1. The gateway kept group 0 and
// skipped it for its kind: it indexed nothing of such a worker, routed
// every request by load, and predicted no hit the engine had.
func TestHybridModelsAreIndexed(t *testing.T) {
	for _, tc := range []struct{ groups, encoding string }{
		{"sliding_window,full_attention", "map"},
		{"mamba,full_attention", "array"},
	} {
		t.Run(tc.groups, func(t *testing.T) {
			g := startGateway(t)
			f := startFleet(t, g, 2, true, "--kv-cache-groups", tc.groups, "--event-encoding", tc.encoding)
			shared := words("ledger", 160)
			for i := range 4 {
				a := g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": shared + fmt.Sprint(" turn ", i), "max_tokens": 2})
				if a.status != 200 || !a.reported {
					t.Fatalf("request %d: %d %s", i, a.status, a.body)
				}
				if got := predicted(t, a); got != a.usage.cached() {
					t.Errorf("request %d: the engine reported %d cached tokens, the gateway predicted %d", i, a.usage.cached(), got)
				}
				if i > 0 && a.usage.cached() == 0 {
					t.Errorf("request %d found nothing of the shared prefix cached: routed by load", i)
				}
				g.settle(t, f) // the index holds what the engines cache: one group's blocks
			}
		})
	}
}
