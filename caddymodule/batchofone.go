package caddymodule

import (
	"bytes"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// promptOfOne unwraps a /v1/completions prompt sent as a batch of one:
// vLLM's prompt may be a list of strings or a list of token-id lists, and
// a list of one is prefilled exactly as its element alone. It returns the
// element's text (raw JSON, to send to /tokenize) or its token ids; ok is
// false for a larger batch (vLLM serves it as several requests, which the
// gateway cannot route one by one) or anything else, routed by load.
//
// raw is valid JSON (the request decoded). It is scanned, not decoded:
// the first element's bounds are found and a second ends the reading, so
// a batch of a million elements costs a scan of its first one (decoding
// the batch whole cost some 80 times the body: a probe's 16 MiB prompt
// made 1.4 GB), and a batch of one's ids go straight to the strict token
// decoder, as cheap as the same ids sent flat.
func promptOfOne(raw selection.RawJSON) (text selection.RawJSON, ids []uint32, ok bool) {
	b := bytes.TrimSpace(raw)
	if len(b) < 2 || b[0] != '[' {
		return nil, nil, false
	}
	i := skipSpace(b, 1)
	start := i
	switch {
	case i < len(b) && b[i] == '"':
		for i++; i < len(b) && b[i] != '"'; i++ {
			if b[i] == '\\' {
				i++ // the escaped byte
			}
		}
	case i < len(b) && b[i] == '[':
		// A token list holds no nested array or object.
		for i++; i < len(b) && b[i] != ']'; i++ {
			if b[i] == '[' || b[i] == '{' {
				return nil, nil, false
			}
		}
	default:
		return nil, nil, false
	}
	if i >= len(b) {
		return nil, nil, false
	}
	item := b[start : i+1]
	if rest := skipSpace(b, i+1); rest != len(b)-1 || b[rest] != ']' {
		return nil, nil, false // a second element, or more
	}
	if item[0] == '"' {
		return selection.RawJSON(item), nil, true
	}
	var list selection.TokenList
	if list.UnmarshalJSON(item) != nil || len(list) == 0 {
		return nil, nil, false
	}
	return nil, list, true
}

// skipSpace is the index of the first byte of b from i on that is not
// JSON white space.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
