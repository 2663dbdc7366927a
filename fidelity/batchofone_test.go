package fidelity

import (
	"fmt"
	"testing"
)

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
		sentTwice(t, g, fmt.Sprintf("%T", prompt), map[string]any{"model": model, "prompt": prompt, "max_tokens": 2}, 112)
	}
	if p := g.predictions(t, model); p.PromptTokensMismatch != 0 || p.CachedExact+p.NoCachedTokens != 4 {
		t.Fatalf("the gateway's accounting: %+v", p)
	}
}

// sentTwice sends a completion body twice through g: each time the
// gateway's prediction must be what the engine reported, and the second
// time at least minCached tokens must be found cached (it went to the
// worker holding the first).
func sentTwice(t *testing.T, g *gateway, what string, body any, minCached int) {
	t.Helper()
	for round := range 2 {
		a := g.post(t, "/v1/completions", body)
		if a.status != 200 || !a.reported {
			t.Fatalf("%s round %d: %d %s", what, round, a.status, a.body)
		}
		if want := predicted(t, a); a.usage.cached() != want {
			t.Errorf("%s round %d: the engine reported %d cached tokens, the gateway predicted %d", what, round, a.usage.cached(), want)
		}
		if round == 1 && a.usage.cached() < minCached {
			t.Errorf("%s: the repeated prompt found %d tokens cached: not routed to the worker holding it", what, a.usage.cached())
		}
	}
}
