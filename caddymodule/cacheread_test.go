package caddymodule

import (
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestSkipsPrefixCacheAsVLLM: the requests for which vLLM reads no prefix
// cache, as its request models make prompt_logprobs: the member itself
// (chat or completions), echo with logprobs on completions, and echo on
// chat unless top_logprobs (default 0) is sent as null. echo is read as
// vLLM's pydantic reads a bool.
func TestSkipsPrefixCacheAsVLLM(t *testing.T) {
	cases := []struct {
		body string
		chat bool
		skip bool
	}{
		{`{"prompt": "x"}`, false, false},
		{`{"prompt": "x", "prompt_logprobs": 0}`, false, true},
		{`{"prompt": "x", "prompt_logprobs": null}`, false, false},
		{`{"prompt": "x", "echo": true}`, false, false},
		{`{"prompt": "x", "echo": true, "logprobs": null}`, false, false},
		{`{"prompt": "x", "echo": true, "logprobs": 1}`, false, true},
		{`{"prompt": "x", "echo": false, "logprobs": 1}`, false, false},
		{`{"prompt": "x", "echo": "true", "logprobs": 1}`, false, true},
		{`{"prompt": "x", "echo": 1, "logprobs": 1}`, false, true},
		{`{"prompt": "x", "echo": "no", "logprobs": 1}`, false, false},
		{`{"messages": [], "echo": "yes"}`, true, true},
		{`{"prompt": "x", "logprobs": 5}`, false, false},
		{`{"messages": [], "prompt_logprobs": 2}`, true, true},
		{`{"messages": [], "echo": true}`, true, true},
		{`{"messages": [], "echo": true, "top_logprobs": null}`, true, false},
		{`{"messages": [], "echo": true, "top_logprobs": 3}`, true, true},
		{`{"messages": [], "logprobs": true, "top_logprobs": 3}`, true, false},
	}
	for _, c := range cases {
		var o openAIRequest
		if err := selection.DecodeJSON([]byte(c.body), &o); err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if got := o.skipsPrefixCache(c.chat); got != c.skip {
			t.Errorf("%s (chat %v): skips the cache %v, want %v", c.body, c.chat, got, c.skip)
		}
	}
}
