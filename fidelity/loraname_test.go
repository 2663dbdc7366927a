package fidelity

import (
	"fmt"
	"testing"
)

// lora_name is a selection-API member; vLLM's OpenAI routes have no such
// member and serve the request with its model. A completion that sends one
// is predicted as the engine serves it: the prompt's cached prefix, not
// nothing (the gateway hashed the prompt with the name, found no match
// and sent the request to a cold worker).
func TestLoraNameIsNotTheEngines(t *testing.T) {
	g := startGateway(t)
	f := startFleet(t, g, 2, true)
	prompt := words("contract", 120)
	for i := range 3 {
		body := map[string]any{"model": model, "prompt": prompt + fmt.Sprint(" q", i), "max_tokens": 2}
		if i == 2 {
			body["lora_name"] = "zzz"
		}
		g.settle(t, f)
		a := g.post(t, "/v1/completions", body)
		if a.status != 200 || !a.reported {
			t.Fatalf("request %d: %d %s", i, a.status, a.body)
		}
		if a.usage.cached() != predicted(t, a) {
			t.Errorf("request %d: the engine reported %d cached tokens, the gateway predicted %d", i, a.usage.cached(), predicted(t, a))
		}
		if i == 2 && a.usage.cached() < 96 {
			t.Errorf("the request with lora_name found %d tokens of its prefix cached", a.usage.cached())
		}
	}
}
