package caddymodule

import (
	"bytes"
	"strings"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// promptOfOne unwraps a /v1/completions prompt sent as a batch of one:
// vLLM's prompt may be a list of strings or a list of token-id lists, and
// a list of one is prefilled exactly as its element alone. It returns the
// element's text (raw JSON, to send to /tokenize) or its token ids; ok is
// false for a larger batch (vLLM serves it as several requests, which the
// gateway cannot route one by one) or anything else, routed by load.
//
// Token ids go straight to the strict token decoder, as cheap as the same
// ids sent flat. With lax (vLLM's prompt, which pydantic reads), ids that
// are not all JSON integers are read as pydantic's lax list[list[int]]
// reads them.
func promptOfOne(raw selection.RawJSON, lax bool) (text selection.RawJSON, ids []uint32, ok bool) {
	item, ok := soleElement(raw)
	switch {
	case !ok:
		return nil, nil, false
	case item[0] == '"':
		return selection.RawJSON(item), nil, true
	case item[0] != '[':
		return nil, nil, false
	}
	var list selection.TokenList
	if list.UnmarshalJSON(item) == nil && len(list) > 0 {
		return nil, list, true
	}
	// Not JSON integers only: pydantic's lax list[list[int]] may still
	// take it ([[7.0, 8.0]], [["7", "8"]]), and vLLM prefill it as one
	// prompt; routed by load, its cache was missed.
	if lax {
		if ids, ok := laxIDs(item, false); ok {
			return nil, ids, true
		}
	}
	return nil, nil, false
}

// soleElement is the element of raw when raw is an array of exactly one
// string, scalar or flat array (one that holds no array or object); ok is
// false for anything else. raw is valid JSON (the request decoded). It is
// scanned, not decoded: the element's bounds are found and a second
// element ends the reading, so a batch of a million elements costs a scan
// of its first one (decoding the batch whole cost some 80 times the body:
// a probe's 16 MiB prompt made 1.4 GB).
func soleElement(raw []byte) (item []byte, ok bool) {
	b := bytes.TrimSpace(raw)
	if len(b) < 2 || b[0] != '[' {
		return nil, false
	}
	i := skipSpace(b, 1)
	start := i
	switch {
	case i >= len(b) || b[i] == '{' || b[i] == ']':
		return nil, false
	case b[i] == '"':
		for i++; i < len(b) && b[i] != '"'; i++ {
			if b[i] == '\\' {
				i++ // the escaped byte
			}
		}
	case b[i] == '[':
		for i++; i < len(b) && b[i] != ']'; i++ {
			if b[i] == '[' || b[i] == '{' {
				return nil, false
			}
		}
	default: // a number, true, false or null: up to what ends it
		for i+1 < len(b) && !strings.ContainsRune(", \t\n\r]", rune(b[i+1])) {
			i++
		}
	}
	if i >= len(b) {
		return nil, false
	}
	if rest := skipSpace(b, i+1); rest != len(b)-1 || b[rest] != ']' {
		return nil, false // a second element, or more
	}
	return b[start : i+1], true
}

// skipSpace is the index of the first byte of b from i on that is not
// JSON white space.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
