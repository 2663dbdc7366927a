package caddymodule

import (
	"bytes"
	"encoding/json"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// promptOfOne unwraps a /v1/completions prompt sent as a batch of one:
// vLLM's prompt may be a list of strings or a list of token-id lists, and
// a list of one is prefilled exactly as its element alone. It returns the
// element's text (raw JSON, to send to /tokenize) or its token ids; ok is
// false for a larger batch (vLLM serves it as several requests, which the
// gateway cannot route one by one) or anything else, routed by load.
//
// Only the first element is read, and a second ends the reading: a batch
// of a million elements costs a scan of its first one, where decoding the
// batch whole cost some 80 times the body (a probe's 16 MiB prompt made
// 1.4 GB). Token ids go through the strict token decoder.
func promptOfOne(raw selection.RawJSON) (text selection.RawJSON, ids []uint32, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') || !dec.More() {
		return nil, nil, false
	}
	var first json.RawMessage
	if dec.Decode(&first) != nil || dec.More() {
		return nil, nil, false
	}
	item := bytes.TrimSpace(first)
	switch {
	case len(item) > 0 && item[0] == '"':
		return selection.RawJSON(item), nil, true
	case len(item) > 0 && item[0] == '[':
		var list selection.TokenList
		if list.UnmarshalJSON(item) != nil || len(list) == 0 {
			return nil, nil, false
		}
		return nil, list, true
	}
	return nil, nil, false
}
