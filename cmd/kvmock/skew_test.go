package main

import (
	"slices"
	"testing"
)

// TestTokenizeSkew checks the deliberate disagreements: /tokenize's chat
// answer differs from what the chat route prefills, and a gateway that
// routes by it predicts a hit the engine does not report.
func TestTokenizeSkew(t *testing.T) {
	for _, skew := range []TokenizeSkew{SkewBOS, SkewTemplate} {
		f := newTestFleet(t, func(c *Config) { c.TokenizeSkew = skew })
		honest := newTestFleet(t, nil)
		chat := agentChat()
		got := tokenizeVia(t, f, 1, chat)
		want := tokenizeVia(t, honest, 1, chat)
		c := completeVia(t, f, 1, "/v1/chat/completions", with(chat, "max_tokens", 1))
		if c.Usage.PromptTokens != want.Count {
			t.Fatalf("%s: the chat route prefilled %d tokens, want the honest %d", skew, c.Usage.PromptTokens, want.Count)
		}
		switch skew {
		case SkewBOS:
			if !slices.Equal(got.Tokens, want.Tokens[1:]) {
				t.Fatalf("bos: /tokenize answered %v…, want the honest tokens without BOS", got.Tokens[:4])
			}
		case SkewTemplate:
			noTools := tokenizeVia(t, honest, 1, with(chat, "tools", nil))
			if !slices.Equal(got.Tokens, noTools.Tokens) || slices.Equal(got.Tokens, want.Tokens) {
				t.Fatal("template: /tokenize did not render without the tools")
			}
		}
		// Text prompts are not skewed.
		if a, b := tokenizeVia(t, f, 1, map[string]any{"prompt": "a b"}), tokenizeVia(t, honest, 1, map[string]any{"prompt": "a b"}); !slices.Equal(a.Tokens, b.Tokens) {
			t.Fatalf("%s skewed a text prompt", skew)
		}
	}
	if _, err := parseFlags([]string{"--tokenize-skew", "sideways"}); err == nil {
		t.Fatal("an unknown skew was accepted")
	}
	if cfg, err := parseFlags([]string{"--tokenize-skew", "bos", "--enable-prompt-tokens-details", "--enable-force-include-usage", "--admin", ""}); err != nil ||
		cfg.TokenizeSkew != SkewBOS || !cfg.EnablePromptTokensDetails || !cfg.EnableForceIncludeUsage {
		t.Fatalf("flags: %+v %v", cfg, err)
	}
}
