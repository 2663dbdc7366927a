package fidelity

import "testing"

// Without KV events (use_kv_events off) the gateway takes a booked prompt
// as cached on its worker. A prompt the engine refuses (here with a 400:
// max_tokens 0, which vLLM's sampling parameters refuse and the gateway
// does not check) caches nothing there,
// yet it was recorded on booking, and the same prompt sent again was
// promised its whole prefix (112 tokens predicted, 0 found). It is now
// recorded when the worker answers 2xx.
func TestApproxModeRecordsWhatTheEngineServed(t *testing.T) {
	g := startGatewayWith(t, "use_kv_events off")
	startFleet(t, g, 1, true)
	prompt := words("cellar", 120)
	refused := g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 0})
	if refused.status != 400 {
		t.Fatalf("max_tokens 0: %d %s, want the engine's 400", refused.status, refused.body)
	}
	for i, wantCached := range []bool{false, true} {
		a := g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 2})
		if a.status != 200 || !a.reported {
			t.Fatalf("send %d: %d %s", i, a.status, a.body)
		}
		if got := predicted(t, a); got != a.usage.cached() || (a.usage.cached() > 0) != wantCached {
			t.Errorf("send %d: the engine reported %d cached tokens, the gateway predicted %d (want a hit: %v)", i, a.usage.cached(), got, wantCached)
		}
	}
}
