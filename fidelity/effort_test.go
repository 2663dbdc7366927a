package fidelity

import "testing"

// vLLM's chat route hands a request's reasoning_effort to the chat
// template, with enable_thinking true unless the effort is "none"; its
// /tokenize has no such field. The faithful engines' template writes
// both into its system block, so a gateway that tokenizes without them
// disagrees with the engine on every block (it used to: a prompt-length
// mismatch on each request, and no hit predicted).
func TestReasoningEffortPredictionsMatchTheEngine(t *testing.T) {
	g := startGateway(t)
	startFleet(t, g, 2, true)
	messages := []map[string]any{{"role": "system", "content": words("rules", 100)}, {"role": "user", "content": "why?"}}
	for i, effort := range []any{"high", "high", "none", "none", nil} {
		body := map[string]any{"model": model, "messages": messages, "max_tokens": 2}
		if effort != nil {
			body["reasoning_effort"] = effort
		}
		a := g.post(t, "/v1/chat/completions", body)
		if a.status != 200 || !a.reported {
			t.Fatalf("request %d: %d %s", i, a.status, a.body)
		}
		if want := predicted(t, a); a.usage.cached() != want {
			t.Errorf("request %d (effort %v): the engine reported %d cached tokens of %d, the gateway predicted %d",
				i, effort, a.usage.cached(), a.usage.PromptTokens, want)
		}
		if (i == 1 || i == 3) && a.usage.cached() == 0 {
			t.Errorf("request %d (effort %v): the repeated chat found nothing cached", i, effort)
		}
	}
	if p := g.predictions(t, model); p.PromptTokensMismatch != 0 {
		t.Fatalf("the gateway's accounting: %+v", p)
	}
}
