package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// SGLang's ways for a request to choose its cache namespace, served with
// --api sglang (SGLang's OpenAI routes and its documentation):
//
//   - a LoRA adapter is named either in model, as "<base model>:<adapter>",
//     or with the base model in model and the adapter in lora_path; the
//     adapter must be loaded (a 400 otherwise). Its blocks are the
//     adapter's own, and its events name it in lora_name, as vLLM's do.
//   - extra_key puts the request's blocks in a namespace of their own: the
//     radix cache is keyed by (extra_key, tokens), so only a request with
//     the same key reads them. SGLang's KV events do not name the key:
//     the stored blocks' events carry their tokens and nothing else, which
//     is what makes such requests invisible to a gateway.
//
// With --api vllm both members are ignored, as vLLM ignores members it
// does not know, and an adapter is named by its bare name in model.

// resolveAdapter maps a request to the adapter that serves it ("" for the
// base model) under the worker's request API.
func (w *worker) resolveAdapter(req *apiRequest) (string, error) {
	if w.cfg.API != APISGLang {
		return w.resolveModel(req.Model)
	}
	model, adapter := req.Model, ""
	// SGLang splits a model it does not serve at the first colon and
	// trims both parts; an empty adapter is the base model alone.
	if base, name, ok := strings.Cut(model, ":"); ok && model != w.cfg.Model && strings.TrimSpace(base) == w.cfg.Model {
		model, adapter = strings.TrimSpace(base), strings.TrimSpace(name)
	} else if isSet(req.LoraPath) {
		if err := json.Unmarshal(req.LoraPath, &adapter); err != nil {
			return "", badRequest("lora_path must be a string")
		}
	}
	lora, err := w.resolveModel(model)
	if err != nil || adapter == "" {
		return lora, err
	}
	if _, ok := w.adapters[adapter]; !ok {
		return "", &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf("LoRA adapter %q is not loaded", adapter), param: "lora_path"}
	}
	return adapter, nil
}

// extraKey is the request's SGLang extra_key, "" for none (or under --api
// vllm, which has no such member).
func (w *worker) extraKey(req *apiRequest) string {
	if w.cfg.API != APISGLang || req.ExtraKey == nil {
		return ""
	}
	return *req.ExtraKey
}

// keyPart is what an extra_key adds to the salt the block hashes are
// chained from: nothing for none, else a part no cache_salt can spell
// (a salt is JSON text, which holds no NUL), so that a key's blocks are
// apart from every salt's and every other key's.
func keyPart(key string) string {
	if key == "" {
		return ""
	}
	return "\x00extra_key\x00" + key
}
