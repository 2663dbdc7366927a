package fidelity

import (
	"strings"
	"testing"
)

// vLLM reads its requests with pydantic's lax mode: "true", 1 or "yes" is
// a true bool, "100" or 100.0 an int. The faithful engines read echo,
// truncate_prompt_tokens and stream so; the gateway read JSON's own types
// only, so "echo": "true" was promised the cached prefix the engine then
// did not read, "truncate_prompt_tokens": "100" was hashed whole, and
// "stream": "true" streamed without the usage the gateway adds to check
// its prediction.
func TestLaxValuesMatchTheEngine(t *testing.T) {
	g := startGateway(t)
	startFleet(t, g, 1, true)
	prompt := words("quill", 200)
	if a := g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 2}); a.status != 200 {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	cases := []struct {
		extra      map[string]any
		prefilled  int  // the engine's prompt tokens; 0: not checked
		cachedSome bool // the engine must report a hit
	}{
		{map[string]any{"echo": "true", "logprobs": 1}, 0, false},
		{map[string]any{"echo": 1, "logprobs": 1}, 0, false},
		{map[string]any{"echo": "no", "logprobs": 1}, 0, true},
		{map[string]any{"truncate_prompt_tokens": "100"}, 100, false},
		{map[string]any{"truncate_prompt_tokens": 100.0, "truncation_side": "right"}, 100, true},
		{map[string]any{"truncate_prompt_tokens": " 100 "}, 100, true},
		{map[string]any{"truncate_prompt_tokens": "1_00", "truncation_side": "right"}, 100, true}, // Python's digit separator
		{map[string]any{"stream": "true"}, 0, true},
		{map[string]any{"stream": 1, "echo": "yes", "logprobs": 0}, 0, false},
	}
	for i, c := range cases {
		body := map[string]any{"model": model, "prompt": prompt, "max_tokens": 2}
		for k, v := range c.extra {
			body[k] = v
		}
		before := g.predictions(t, model)
		a := g.post(t, "/v1/completions", body)
		if a.status != 200 {
			t.Fatalf("case %d %v: %d %s", i, c.extra, a.status, a.body)
		}
		after := g.predictions(t, model)
		if after.Requests != before.Requests+1 || after.NoUsage != before.NoUsage {
			t.Errorf("case %d %v: the gateway saw no usage for it (requests %d → %d, without usage %d → %d)",
				i, c.extra, before.Requests, after.Requests, before.NoUsage, after.NoUsage)
		}
		if exact := func(p modelPredictions) uint64 { return p.CachedExact + p.NoCachedTokens }; exact(after) != exact(before)+1 {
			t.Errorf("case %d %v: the gateway's prediction was not the engine's report: %+v", i, c.extra, after)
		}
		if _, streamed := c.extra["stream"]; streamed {
			continue // the usage the gateway asked for is not passed on: the client did not ask
		}
		if want := c.prefilled; want != 0 && a.usage.PromptTokens != want {
			t.Errorf("case %d %v: the engine prefilled %d tokens, want %d", i, c.extra, a.usage.PromptTokens, want)
		}
		if c.cachedSome && a.usage.cached() == 0 {
			t.Errorf("case %d %v: the engine found nothing cached", i, c.extra)
		}
		if got := predicted(t, a); got != a.usage.cached() {
			t.Errorf("case %d %v: the engine reported %d cached tokens, the gateway predicted %d", i, c.extra, a.usage.cached(), got)
		}
	}
	// A value pydantic refuses is the engine's 400, whatever the gateway
	// made of it.
	if a := g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 2, "echo": "maybe"}); a.status != 400 ||
		!strings.Contains(string(a.body), "boolean") {
		t.Errorf(`"echo": "maybe": %d %s, want the engine's 400`, a.status, a.body)
	}
	if p := g.predictions(t, model); p.PromptTokensMismatch != 0 {
		t.Fatalf("the gateway's accounting: %+v", p)
	}
}
