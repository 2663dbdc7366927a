package caddymodule

import "github.com/kvrouter/caddy-kvrouter/selection"

// cacheReadFields are the members that decide whether vLLM reads its
// prefix cache for a request at all. It does not when the request asks
// for the prompt's logprobs (a cached prefix is never computed, so it
// would have none): vLLM sets its sampling parameters'
// skip_reading_prefix_cache whenever prompt_logprobs is set, and sets
// prompt_logprobs from the request's own member or, with echo, from
// logprobs on /v1/completions and from top_logprobs (default 0, so set
// unless sent as null) on /v1/chat/completions. Such a request finds
// nothing cached on any worker; routed by its prefix it would be sent,
// with a promise of cached tokens, to a worker that only holds blocks it
// will compute again. It is routed by load instead.
type cacheReadFields struct {
	PromptLogprobs selection.RawJSON `json:"prompt_logprobs"`
	Echo           selection.RawJSON `json:"echo"`
	Logprobs       selection.RawJSON `json:"logprobs"`
	TopLogprobs    selection.RawJSON `json:"top_logprobs"`
	// PromptEmbeds are prompt embeddings (vLLM's --enable-prompt-embeds),
	// which the engine prefills, alone or beside the prompt, and hashes
	// into its blocks: nothing the gateway can hash.
	PromptEmbeds selection.RawJSON `json:"prompt_embeds"`
}

// embedsPrompt reports whether the request's prompt is, or has, prompt
// embeddings.
func (f *cacheReadFields) embedsPrompt() bool { return f.PromptEmbeds.IsSet() }

// skipsPrefixCache reports whether vLLM will not read its prefix cache
// for the request (chat: a /v1/chat/completions request).
func (f *cacheReadFields) skipsPrefixCache(chat bool) bool {
	switch {
	case f.PromptLogprobs.IsSet():
		return true
	case !laxTrue(f.Echo):
		return false
	case chat:
		return f.TopLogprobs == nil || f.TopLogprobs.IsSet()
	}
	return f.Logprobs.IsSet()
}
