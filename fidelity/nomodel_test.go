package fidelity

import (
	"net/http"
	"testing"
)

// A request that names no model is served by vLLM with its one model;
// the gateway does the same while its workers serve one model (it used
// to look for the selection API's model "default" and answer 404), and
// does not guess once they serve two.
func TestRequestWithoutAModel(t *testing.T) {
	g := startGateway(t)
	startFleet(t, g, 1, true, "--model", "quay-model")
	prompt := words("quay", 100)
	for round := range 2 {
		a := g.post(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2})
		if a.status != http.StatusOK || !a.reported {
			t.Fatalf("round %d: %d %s", round, a.status, a.body)
		}
		if want := predicted(t, a); a.usage.cached() != want || round == 1 && want == 0 {
			t.Errorf("round %d: the engine reported %d cached tokens, the gateway predicted %d", round, a.usage.cached(), want)
		}
	}
	// A second model in the catalog (a worker the gateway need not reach).
	g.register(t, map[string]any{"worker_id": 99, "model_name": "other", "endpoint": "127.0.0.1:9", "block_size": blockSize})
	if a := g.post(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2}); a.status != http.StatusNotFound {
		t.Errorf("with two models: %d %s, want 404", a.status, a.body)
	}
}
