package main

import (
	"encoding/json"
	"net/http"
	"testing"
)

// sglangFleet is a two-worker fleet following SGLang's request API, both
// workers loading the adapter "sql".
func sglangFleet(t *testing.T) *Fleet {
	return newTestFleet(t, func(c *Config) {
		c.API = APISGLang
		c.LoraModules = []LoraModule{{Name: "sql", Path: "/adapters/sql"}}
	})
}

// TestSGLangAdapterAndKeyNamespaces: "<model>:<adapter>" and lora_path
// reach the same adapter, whose blocks the base model does not read; an
// extra_key's blocks are read by the same key only; an adapter not loaded
// is a 400. Under the vLLM API the same members change nothing.
func TestSGLangAdapterAndKeyNamespaces(t *testing.T) {
	f := sglangFleet(t)
	p := tokenRange(1, 64)
	send := func(extra ...any) int {
		t.Helper()
		c := completeVia(t, f, 1, "/v1/completions", with(map[string]any{"model": "default", "prompt": p, "max_tokens": 1}, extra...))
		return c.Usage.PromptTokensDetails.CachedTokens
	}
	send("model", "default:sql")
	for name, got := range map[string]int{
		"the same adapter by name in model": send("model", "default:sql"),
		"the same adapter by lora_path":     send("lora_path", "sql"),
	} {
		if got != 48 {
			t.Errorf("%s: %d cached, want 48", name, got)
		}
	}
	if got := send(); got != 0 {
		t.Errorf("the base model read %d of the adapter's tokens", got)
	}
	if got := send("extra_key", "k1"); got != 0 {
		t.Errorf("a keyed request read %d of the base model's tokens", got)
	}
	if got := send("extra_key", "k1"); got != 48 {
		t.Errorf("the same key again: %d cached, want 48", got)
	}
	if got := send("extra_key", "k2"); got != 0 {
		t.Errorf("another key read %d of k1's tokens", got)
	}
	res, b := postJSON(t, f.url(1)+"/v1/completions", map[string]any{"model": "default", "lora_path": "nope", "prompt": p})
	if res.StatusCode != http.StatusBadRequest {
		t.Errorf("an adapter not loaded: %d %s", res.StatusCode, b)
	}

	v := newTestFleet(t, func(c *Config) { c.LoraModules = []LoraModule{{Name: "sql", Path: "/adapters/sql"}} })
	completeVia(t, v, 1, "/v1/completions", map[string]any{"model": "default", "prompt": p, "max_tokens": 1})
	c := completeVia(t, v, 1, "/v1/completions", map[string]any{"model": "default", "prompt": p, "max_tokens": 1, "lora_path": "sql", "extra_key": "k"})
	if got := c.Usage.PromptTokensDetails.CachedTokens; got != 48 {
		t.Errorf("vLLM API: lora_path and extra_key changed the cache read (%d cached, want 48)", got)
	}
}

// TestSGLangGenerate: /generate takes text or input_ids (a batch of one
// too), reports prompt and cached tokens in meta_info, refuses both prompt
// forms at once, reads no cache with return_logprob from 0, and exists
// only under the SGLang API.
func TestSGLangGenerate(t *testing.T) {
	f := sglangFleet(t)
	type generated struct {
		Text     string `json:"text"`
		MetaInfo struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
			CachedTokens     int `json:"cached_tokens"`
		} `json:"meta_info"`
	}
	gen := func(body map[string]any) generated {
		t.Helper()
		var g generated
		if err := json.Unmarshal(mustPost(t, f.url(1)+"/generate", body), &g); err != nil {
			t.Fatal(err)
		}
		return g
	}
	ids := tokenRange(1, 64)
	params := map[string]any{"max_new_tokens": 2}
	if g := gen(map[string]any{"input_ids": ids, "sampling_params": params}); g.MetaInfo.PromptTokens != 64 || g.MetaInfo.CompletionTokens != 2 || g.MetaInfo.CachedTokens != 0 {
		t.Errorf("a cold prompt: %+v", g)
	}
	if g := gen(map[string]any{"input_ids": [][]uint32{ids}, "sampling_params": params}); g.MetaInfo.CachedTokens != 48 {
		t.Errorf("a batch of one, warm: %+v", g)
	}
	if g := gen(map[string]any{"input_ids": ids, "sampling_params": params, "return_logprob": true, "logprob_start_len": 0}); g.MetaInfo.CachedTokens != 0 {
		t.Errorf("logprobs from the start read %d cached tokens", g.MetaInfo.CachedTokens)
	}
	if g := gen(map[string]any{"text": "a b c", "sampling_params": params}); g.MetaInfo.PromptTokens != 4 {
		t.Errorf("text is encoded with its BOS token: %+v", g)
	}
	if res, b := postJSON(t, f.url(1)+"/generate", map[string]any{"text": "a", "input_ids": ids}); res.StatusCode != http.StatusBadRequest {
		t.Errorf("text and input_ids: %d %s", res.StatusCode, b)
	}
	if g := gen(map[string]any{"text": nil, "input_ids": ids, "sampling_params": params}); g.MetaInfo.PromptTokens != 64 {
		t.Errorf("a null text beside input_ids: %+v", g)
	}
	v := newTestFleet(t, nil)
	if res, _ := postJSON(t, v.url(1)+"/generate", map[string]any{"input_ids": ids}); res.StatusCode != http.StatusNotFound {
		t.Errorf("/generate under the vLLM API: %d", res.StatusCode)
	}
}
