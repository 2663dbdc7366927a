package fidelity

import (
	"fmt"
	"testing"
)

// SGLang's two ways to name a LoRA adapter, through engines that follow
// SGLang's request API (kvmock --api sglang): "<model>:<adapter>" in
// model, and the base model with lora_path. Both reach the same adapter
// and so the same cached blocks, which the engine's events name by the
// adapter (lora_name). Every prediction must be the engine's reported
// hit; the base model on the same prompt shares nothing with the adapter.
// (Before the gateway read these forms, "<model>:<adapter>" was its own
// 404, and a lora_path request was promised the base model's blocks and
// found the adapter's.)
func TestSGLangAdapterForms(t *testing.T) {
	g := startGateway(t)
	f := startFleet(t, g, 2, true, "--api", "sglang", "--lora-modules", "sql=/adapters/sql")
	shared := words("schema", 120)
	send := func(i int, body map[string]any) answer {
		t.Helper()
		body["prompt"] = shared + " " + words(fmt.Sprintf("query%d_", i), 12)
		body["max_tokens"] = 2
		g.settle(t, f)
		a := g.post(t, "/v1/completions", body)
		if a.status != 200 || !a.reported {
			t.Fatalf("request %d %v: %d %s", i, body["model"], a.status, a.body)
		}
		if want := predicted(t, a); a.usage.cached() != want {
			t.Errorf("request %d (%v, lora_path %v): the engine reported %d cached tokens, the gateway predicted %d",
				i, body["model"], body["lora_path"], a.usage.cached(), want)
		}
		return a
	}
	send(0, map[string]any{"model": model + ":sql"})
	if a := send(1, map[string]any{"model": model + ":sql"}); a.usage.cached() < 96 {
		t.Errorf("the adapter's second request found %d of its shared prefix cached", a.usage.cached())
	}
	if a := send(2, map[string]any{"model": model, "lora_path": "sql"}); a.usage.cached() < 96 {
		t.Errorf("lora_path reached the adapter's blocks: %d cached", a.usage.cached())
	}
	if a := send(3, map[string]any{"model": model}); a.usage.cached() != 0 {
		t.Errorf("the base model found %d of the adapter's tokens cached", a.usage.cached())
	}
	// SGLang trims both parts of the colon form, and reads an empty
	// adapter as the base model.
	if a := send(4, map[string]any{"model": " " + model + " : sql "}); a.usage.cached() < 96 {
		t.Errorf("the spaced colon form reached the adapter's blocks: %d cached", a.usage.cached())
	}
	if a := send(5, map[string]any{"model": model + ":"}); a.usage.cached() < 96 {
		t.Errorf("an empty adapter is the base model, whose shared prefix request 3 cached: %d cached", a.usage.cached())
	}
	if a := g.post(t, "/v1/completions", map[string]any{"model": model, "lora_path": "nope", "prompt": shared}); a.status != 400 {
		t.Errorf("an adapter no worker loaded: %d %s, want the engine's 400", a.status, a.body)
	}
}

// An SGLang extra_key keeps a request's blocks apart from every other
// request's, and SGLang's events do not say which blocks a key holds: a
// keyed request is routed by load with nothing promised, where the
// gateway promised it the plain prompt's blocks (which the engine does
// not read for it).
func TestSGLangExtraKeyIsRoutedByLoad(t *testing.T) {
	g := startGateway(t)
	f := startFleet(t, g, 2, true, "--api", "sglang")
	prompt := words("policy", 120)
	for i := range 2 {
		g.settle(t, f)
		a := g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": prompt + fmt.Sprint(" plain", i), "max_tokens": 2})
		if a.status != 200 || a.usage.cached() != predicted(t, a) {
			t.Fatalf("plain request %d: %d, reported %d cached, predicted %d", i, a.status, a.usage.cached(), predicted(t, a))
		}
	}
	g.settle(t, f)
	a := g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": prompt + " keyed", "max_tokens": 2, "extra_key": "tenant-b"})
	if a.status != 200 || !a.reported {
		t.Fatalf("keyed request: %d %s", a.status, a.body)
	}
	if a.usage.cached() != 0 || predicted(t, a) != 0 {
		t.Errorf("keyed request: the engine reported %d cached tokens, the gateway predicted %d; want 0 and 0", a.usage.cached(), predicted(t, a))
	}
}

// SGLang's native /generate, with no model: its prompt as input_ids or as
// text (tokenized as a completion's prompt), a one-element batch of
// either too, streamed or not. Each is routed by its prefix and its
// prediction is the engine's reported cached_tokens (meta_info), which
// the gateway's accounting reads (before, every /generate was routed by
// load with nothing predicted); a request for the prompt's logprobs from
// position 0 reads no cache and is routed by load.
func TestSGLangGenerate(t *testing.T) {
	g := startGateway(t)
	f := startFleet(t, g, 2, true, "--api", "sglang")
	ids := make([]int, 160)
	for i := range ids {
		ids[i] = 1000 + i
	}
	text := words("manual", 150)
	send := func(name string, body map[string]any) answer {
		t.Helper()
		g.settle(t, f)
		a := g.post(t, "/generate", body)
		if a.status != 200 || !a.reported {
			t.Fatalf("%s: %d %s", name, a.status, a.body)
		}
		if want := predicted(t, a); a.usage.cached() != want {
			t.Errorf("%s: the engine reported %d cached tokens, the gateway predicted %d", name, a.usage.cached(), want)
		}
		return a
	}
	params := map[string]any{"max_new_tokens": 2}
	send("input_ids, cold", map[string]any{"input_ids": append(ids, 1), "sampling_params": params})
	if a := send("input_ids, warm", map[string]any{"input_ids": append(ids, 2), "sampling_params": params}); a.usage.cached() < 144 {
		t.Errorf("input_ids: %d of the shared prefix cached", a.usage.cached())
	}
	if a := send("input_ids, a batch of one", map[string]any{"input_ids": [][]int{append(ids, 3)}, "sampling_params": params}); a.usage.cached() < 144 {
		t.Errorf("input_ids batch of one: %d cached", a.usage.cached())
	}
	send("text, cold", map[string]any{"text": text + " one", "sampling_params": params})
	if a := send("text, warm, streamed", map[string]any{"text": text + " two", "sampling_params": params, "stream": true}); a.usage.cached() < 128 {
		t.Errorf("text: %d of the shared prefix cached", a.usage.cached())
	}
	// /generate has no model member: one sent is ignored, as SGLang
	// ignores it (it was the gateway's 404).
	send("a model member", map[string]any{"input_ids": append(ids, 5), "sampling_params": params, "model": "nosuch"})
	a := send("logprobs from the start", map[string]any{"input_ids": append(ids, 4), "sampling_params": params,
		"return_logprob": true, "logprob_start_len": 0})
	if predicted(t, a) != 0 {
		t.Errorf("a request for the prompt's logprobs was promised %d cached tokens", predicted(t, a))
	}
	if p := g.predictions(t, model); p.CachedExact < 6 || p.NoUsage != 0 || p.PromptTokensMismatch != 0 {
		t.Errorf("the gateway's accounting of /generate: %+v", p)
	}
}
