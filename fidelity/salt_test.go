package fidelity

import (
	"fmt"
	"testing"
)

// Salted requests through engines that salt as vLLM does: the salt goes
// into a request's first block only, and its KV events name it only in
// that block's extra_keys, in the store that starts the chain. Prefill
// is chunked at 64 tokens, so a prompt's later blocks come in stores
// that continue the chain without the salt, and a tenant's second
// request branches from the middle of its first. Every prediction must
// be the engine's reported hit: a tenant's later requests find its
// shared prefix, another tenant's and an unsalted request find nothing
// (before the gateway read extra_keys, the salted requests were
// predicted 0 and the unsalted ones the salted blocks).
func TestSaltedPredictionsMatchTheEngine(t *testing.T) {
	g := startGateway(t)
	startFleet(t, g, 1, true, "--max-num-batched-tokens", "64")
	shared := words("policy", 150)
	send := func(salt any, i int) answer {
		body := map[string]any{"model": model, "prompt": shared + " " + words(fmt.Sprintf("ask%d_", i), 20), "max_tokens": 2}
		if salt != nil {
			body["cache_salt"] = salt
		}
		a := g.post(t, "/v1/completions", body)
		if a.status != 200 || !a.reported {
			t.Fatalf("request %d (salt %v): %d %s", i, salt, a.status, a.body)
		}
		if want := predicted(t, a); a.usage.cached() != want {
			t.Errorf("request %d (salt %v): the engine reported %d cached tokens of %d, the gateway predicted %d",
				i, salt, a.usage.cached(), a.usage.PromptTokens, want)
		}
		return a
	}
	send("tenant-a", 0)
	if a := send("tenant-a", 1); a.usage.cached() < 128 {
		t.Errorf("tenant-a's second request found %d tokens of its shared prefix cached", a.usage.cached())
	}
	if a := send("tenant-b", 2); a.usage.cached() != 0 {
		t.Errorf("tenant-b found %d of tenant-a's tokens cached", a.usage.cached())
	}
	if a := send(nil, 3); a.usage.cached() != 0 {
		t.Errorf("an unsalted request found %d salted tokens cached", a.usage.cached())
	}
	if a := send("tenant-b", 4); a.usage.cached() < 128 {
		t.Errorf("tenant-b's second request found %d tokens cached", a.usage.cached())
	}
	if a := g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": shared, "max_tokens": 2, "cache_salt": ""}); a.status != 400 {
		t.Errorf("an empty cache_salt: %d %s, want vLLM's 400", a.status, a.body)
	}
	if p := g.predictions(t, model); p.PromptTokensMismatch != 0 || p.CachedExact+p.NoCachedTokens != 5 {
		t.Fatalf("the gateway's accounting: %+v", p)
	}
}
