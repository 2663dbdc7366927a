package fidelity

import "testing"

// A completions prompt sent as a batch of one, a list holding one string
// or one token-id list, is prefilled by vLLM exactly as its element alone:
// the gateway routes it by its prefix like the element, where it used to
// route every list but one of integers by load.
func TestBatchOfOnePromptsAreRoutedByPrefix(t *testing.T) {
	g := startGateway(t)
	startFleet(t, g, 2, true)
	text := words("atlas", 120)
	ids := make([]int, 160)
	for i := range ids {
		ids[i] = 1000 + i
	}
	for _, prompt := range []any{[]string{text}, [][]int{ids}} {
		for round := range 2 {
			a := g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 2})
			if a.status != 200 || !a.reported {
				t.Fatalf("%T round %d: %d %s", prompt, round, a.status, a.body)
			}
			if want := predicted(t, a); a.usage.cached() != want {
				t.Errorf("%T round %d: the engine reported %d cached tokens, the gateway predicted %d", prompt, round, a.usage.cached(), want)
			}
			if round == 1 && a.usage.cached() < 112 {
				t.Errorf("%T: the repeated prompt found %d tokens cached: not routed to the worker holding it", prompt, a.usage.cached())
			}
		}
	}
	if p := g.predictions(t, model); p.PromptTokensMismatch != 0 || p.CachedExact+p.NoCachedTokens != 4 {
		t.Fatalf("the gateway's accounting: %+v", p)
	}
}
