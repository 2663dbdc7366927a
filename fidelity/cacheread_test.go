package fidelity

import (
	"strings"
	"testing"
)

// Requests that ask for the prompt's logprobs read no prefix cache in
// vLLM (its skip_reading_prefix_cache), and the faithful engines do the
// same: the gateway must not promise them cached tokens. Before it knew,
// each was predicted its whole cached prefix and the engine reported 0.
func TestPromptLogprobsReadNoCache(t *testing.T) {
	g := startGateway(t)
	startFleet(t, g, 1, true)
	prompt := words("ledger", 120)
	first := g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 2})
	if first.status != 200 {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	messages := []map[string]any{{"role": "user", "content": prompt}}
	g.post(t, "/v1/chat/completions", map[string]any{"model": model, "messages": messages, "max_tokens": 2})
	cases := []struct {
		path string
		body map[string]any
	}{
		{"/v1/completions", map[string]any{"prompt_logprobs": 1}},
		{"/v1/completions", map[string]any{"echo": true, "logprobs": 1}},
		{"/v1/chat/completions", map[string]any{"echo": true}},
		{"/v1/chat/completions", map[string]any{"prompt_logprobs": 0}},
	}
	for i, c := range cases {
		c.body["model"], c.body["max_tokens"] = model, 2
		if strings.Contains(c.path, "chat") {
			c.body["messages"] = messages
		} else {
			c.body["prompt"] = prompt
		}
		a := g.post(t, c.path, c.body)
		if a.status != 200 || !a.reported {
			t.Fatalf("case %d: %d %s", i, a.status, a.body)
		}
		if got := predicted(t, a); a.usage.cached() != 0 || got != 0 {
			t.Errorf("case %d (%s): the engine reported %d cached tokens, the gateway predicted %d; want 0 and 0", i, c.path, a.usage.cached(), got)
		}
	}
	// The same prompt without them still finds its cache.
	if a := g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 2, "echo": true}); a.usage.cached() == 0 || predicted(t, a) != a.usage.cached() {
		t.Errorf("echo alone: the engine reported %d cached tokens, the gateway predicted %d", a.usage.cached(), predicted(t, a))
	}
	if p := g.predictions(t, model); p.PromptTokensMismatch != 0 || p.CachedExact+p.NoCachedTokens != p.Requests {
		t.Fatalf("the gateway's accounting: %+v", p)
	}
}
