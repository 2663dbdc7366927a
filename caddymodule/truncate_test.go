package caddymodule

import (
	"slices"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestTruncateAsVLLM: the last N tokens by default, the first N on the
// right; -1 (the model's length), 0, a count past the prompt and a value
// that is not a count leave it whole. The count is read as vLLM's
// pydantic reads an int: "2", 2.0 and "2.0" are 2, true is 1.
func TestTruncateAsVLLM(t *testing.T) {
	toks := []uint32{1, 2, 3, 4, 5}
	cases := []struct {
		body string
		want []uint32
	}{
		{`{}`, toks},
		{`{"truncate_prompt_tokens": 2}`, []uint32{4, 5}},
		{`{"truncate_prompt_tokens": 2, "truncation_side": "left"}`, []uint32{4, 5}},
		{`{"truncate_prompt_tokens": 2, "truncation_side": "right"}`, []uint32{1, 2}},
		{`{"truncate_prompt_tokens": 2, "truncation_side": "\u0072ight"}`, []uint32{1, 2}}, // the engine decodes escapes
		{`{"truncate_prompt_tokens": -1}`, toks},
		{`{"truncate_prompt_tokens": 0}`, toks},
		{`{"truncate_prompt_tokens": 9}`, toks},
		{`{"truncate_prompt_tokens": null}`, toks},
		{`{"truncate_prompt_tokens": "2"}`, []uint32{4, 5}},
		{`{"truncate_prompt_tokens": 2.0}`, []uint32{4, 5}},
		{`{"truncate_prompt_tokens": " 2.00 "}`, []uint32{4, 5}},
		{`{"truncate_prompt_tokens": true}`, []uint32{5}},
		{`{"truncate_prompt_tokens": 2.5}`, toks},
		{`{"truncate_prompt_tokens": "two"}`, toks},
		{`{"truncate_prompt_tokens": [2]}`, toks},
	}
	for _, c := range cases {
		var o openAIRequest
		if err := selection.DecodeJSON([]byte(c.body), &o); err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if got := o.truncate(toks); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.body, got, c.want)
		}
	}
}
