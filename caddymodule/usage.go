package caddymodule

import (
	"bytes"
	"encoding/json"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// What the engine says it did with a request: vLLM and SGLang end a
// completion with an OpenAI usage object, in the JSON answer or, when
// streaming with stream_options.include_usage (or an engine that forces
// it), in the last chunk before [DONE]. Its prompt_tokens is what the
// engine prefilled and prompt_tokens_details.cached_tokens what its prefix
// cache served (vLLM reports it with --enable-prompt-tokens-details,
// SGLang with --enable-cache-report).

// usageTailSize is how much of the end of a response is kept to find the
// usage object in. Both engines write usage last or nearly last (vLLM
// follows it with a few null fields; a stream has only "data: [DONE]"
// after it), so a few KiB hold it whatever the response's length, and the
// memory per request stays fixed.
const usageTailSize = 8 << 10

// responseTail keeps the last usageTailSize bytes written through it. It
// copies at most that much per write, so a long answer costs a bounded
// copy, not a buffer of its size.
type responseTail struct {
	buf []byte // len ≤ usageTailSize
}

// write appends what the tail keeps of b.
func (t *responseTail) write(b []byte) {
	if len(b) >= usageTailSize {
		t.buf = append(t.buf[:0], b[len(b)-usageTailSize:]...)
		return
	}
	if over := len(t.buf) + len(b) - usageTailSize; over > 0 {
		t.buf = t.buf[:copy(t.buf, t.buf[over:])]
	}
	t.buf = append(t.buf, b...)
}

// engineUsage is the part of a usage object the gateway compares with its
// prediction.
type engineUsage struct {
	PromptTokens        int64         `json:"prompt_tokens"`
	PromptTokensDetails *cachedDetail `json:"prompt_tokens_details"`
}

// maxUsageTokens bounds a plausible usage's prompt_tokens: past every
// context an engine runs (the catalog's bound on max_model_len).
const maxUsageTokens = selection.MaxContextTokens

// plausible reports whether u can be an engine's account of a prompt:
// prompt_tokens within 0..maxUsageTokens, cached_tokens within
// 0..prompt_tokens. A worker's usage is taken as a fact about the model
// as a whole: one answer's cached_tokens of 9e18 wrapped the model's
// reported-tokens counter and brought its accuracy from 1 to 0.73.
func (u *engineUsage) plausible() bool {
	if u.PromptTokens < 0 || u.PromptTokens > maxUsageTokens {
		return false
	}
	if d := u.PromptTokensDetails; d != nil && d.CachedTokens != nil {
		return *d.CachedTokens >= 0 && *d.CachedTokens <= u.PromptTokens
	}
	return true
}

// cachedDetail is a usage's prompt_tokens_details.
type cachedDetail struct {
	CachedTokens *int64 `json:"cached_tokens"`
}

// usageKey opens a usage field in a JSON answer or SSE chunk.
var usageKey = []byte(`"usage":`)

// metaInfoKey opens the meta_info field of an SGLang /generate answer or
// stream chunk, which holds prompt_tokens and cached_tokens itself.
var metaInfoKey = []byte(`"meta_info":`)

// findMetaInfo is findUsage for SGLang's /generate: the last meta_info's
// prompt_tokens and cached_tokens, as a usage.
func findMetaInfo(tail []byte) (engineUsage, bool) {
	var m struct {
		PromptTokens int64  `json:"prompt_tokens"`
		CachedTokens *int64 `json:"cached_tokens"`
	}
	if !findLast(tail, metaInfoKey, &m) {
		return engineUsage{}, false
	}
	u := engineUsage{PromptTokens: m.PromptTokens}
	if m.CachedTokens != nil {
		u.PromptTokensDetails = &cachedDetail{CachedTokens: m.CachedTokens}
	}
	return u, true
}

// findUsage returns the last usage object in tail: the one a stream's
// final chunk or a JSON answer ends with. A "usage": null (some servers
// write one in every chunk) or a key cut off by the tail's start is
// skipped for the one before it. ok is false when there is none.
func findUsage(tail []byte) (u engineUsage, ok bool) {
	return u, findLast(tail, usageKey, &u)
}

// maxUsageDecodes bounds the objects findLast tries to decode: an
// honest answer's last one decodes (one before it when the tail's start
// cut the last usage's key off is rare). Each try may read to the tail's
// end, and a worker's answer ending in some 900 unclosed {"usage":{
// cost 28 ms and 21 MB of the gateway's a request, tried each.
const maxUsageDecodes = 4

// findLast decodes into v the object of the last member key in tail that
// holds one and decodes, of the last maxUsageDecodes that hold an object;
// false when none does.
func findLast(tail, key []byte, v any) bool {
	for end, tries := len(tail), 0; end > 0 && tries < maxUsageDecodes; {
		i := bytes.LastIndex(tail[:end], key)
		if i < 0 {
			return false
		}
		end = i
		obj := bytes.TrimLeft(tail[i+len(key):], " \t\r\n")
		if len(obj) == 0 || obj[0] != '{' {
			continue
		}
		tries++
		// Decode reads the one object and ignores what follows it.
		if err := json.NewDecoder(bytes.NewReader(obj)).Decode(v); err != nil {
			continue
		}
		return true
	}
	return false
}
