package fidelity

import "testing"

// truncate_prompt_tokens cuts the prompt before vLLM prefills it (the
// last N tokens, or the first N with truncation_side "right"); /tokenize
// takes no such member, so the gateway cuts the tokens itself. Each
// prediction must be the engine's reported hit and each prompt length
// the engine's, where the gateway used to hash the whole prompt (a
// mismatch on every request, and hits promised on the left cut that the
// engine never had).
func TestTruncatedPromptsMatchTheEngine(t *testing.T) {
	g := startGateway(t)
	startFleet(t, g, 1, true)
	prompt := words("annal", 200)
	messages := []map[string]any{{"role": "user", "content": prompt}}
	sends := []struct {
		path string
		cut  map[string]any
	}{
		{"/v1/completions", nil},
		{"/v1/completions", map[string]any{"truncate_prompt_tokens": 100, "truncation_side": "right"}},
		{"/v1/completions", map[string]any{"truncate_prompt_tokens": 100}},
		{"/v1/completions", map[string]any{"truncate_prompt_tokens": 100}},
		{"/v1/chat/completions", nil},
		{"/v1/chat/completions", map[string]any{"truncate_prompt_tokens": 90}},
		{"/v1/chat/completions", map[string]any{"truncate_prompt_tokens": 90}},
	}
	for i, s := range sends {
		body := map[string]any{"model": model, "max_tokens": 2}
		if s.path == "/v1/completions" {
			body["prompt"] = prompt
		} else {
			body["messages"] = messages
		}
		for k, v := range s.cut {
			body[k] = v
		}
		a := g.post(t, s.path, body)
		if a.status != 200 || !a.reported {
			t.Fatalf("send %d: %d %s", i, a.status, a.body)
		}
		if want := predicted(t, a); a.usage.cached() != want {
			t.Errorf("send %d (%s %v): the engine reported %d cached tokens of %d, the gateway predicted %d",
				i, s.path, s.cut, a.usage.cached(), a.usage.PromptTokens, want)
		}
		if s.cut != nil && a.usage.PromptTokens != s.cut["truncate_prompt_tokens"] {
			t.Errorf("send %d: the engine prefilled %d tokens", i, a.usage.PromptTokens)
		}
		if i == 3 || i == 6 {
			if a.usage.cached() == 0 {
				t.Errorf("send %d: the repeated cut prompt found nothing cached", i)
			}
		}
	}
	if p := g.predictions(t, model); p.PromptTokensMismatch != 0 {
		t.Fatalf("the gateway's accounting: %+v", p)
	}
}
