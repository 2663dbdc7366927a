package main

import (
	"encoding/json"
	"testing"
)

// TestOutputLengthAsTheEnginesRead: the answer's length and the context
// check as vLLM's completions and chat routes, and SGLang's /generate,
// read them, with a context of 100 tokens.
func TestOutputLengthAsTheEnginesRead(t *testing.T) {
	c := DefaultConfig()
	const context = 100
	for _, tc := range []struct {
		route  string // completions, chat or generate
		body   string
		prompt int
		want   int // the answer's length; -1: refused
	}{
		{"completions", `{}`, 84, 16}, // 16 when absent
		{"completions", `{}`, 85, -1},
		{"completions", `{"max_tokens":null}`, 99, 1}, // what the context leaves
		{"completions", `{"max_tokens":null}`, 100, -1},
		{"completions", `{"max_tokens":0}`, 10, -1},
		{"completions", `{"max_tokens":"30"}`, 70, 30},
		{"completions", `{"max_tokens":30}`, 71, -1},
		{"chat", `{}`, 99, 1},
		{"chat", `{}`, 100, -1},
		{"chat", `{"max_tokens":5,"max_completion_tokens":30}`, 70, 30},
		{"chat", `{"max_tokens":5,"max_completion_tokens":0}`, 95, 5},
		{"chat", `{"max_tokens":5,"max_completion_tokens":null}`, 96, -1},
		{"generate", `{"max_new_tokens":30}`, 69, 30},
		{"generate", `{"max_new_tokens":30}`, 70, -1}, // SGLang: reaching the context is refused
		{"generate", `{}`, 99, 1},
		{"generate", `{}`, 100, -1},
	} {
		var ask outputAsk
		if tc.route == "generate" {
			var sp struct {
				MaxNewTokens *int `json:"max_new_tokens"`
			}
			if err := json.Unmarshal([]byte(tc.body), &sp); err != nil {
				t.Fatal(err)
			}
			ask = sglangAsk(sp.MaxNewTokens)
		} else {
			var req apiRequest
			if err := json.Unmarshal([]byte(tc.body), &req); err != nil {
				t.Fatal(err)
			}
			ask = c.vllmAsk(&req, tc.route == "chat")
		}
		n, err := c.outputLength(ask, tc.prompt, context)
		if got := map[bool]int{true: n, false: -1}[err == nil]; got != tc.want {
			t.Errorf("%s %s, %d prompt tokens: %d (%v), want %d", tc.route, tc.body, tc.prompt, got, err, tc.want)
		}
	}
}
