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
func promptOfOne(raw selection.RawJSON) (text selection.RawJSON, ids []uint32, ok bool) {
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil || len(items) != 1 {
		return nil, nil, false
	}
	item := bytes.TrimSpace(items[0])
	switch {
	case len(item) > 0 && item[0] == '"':
		return selection.RawJSON(item), nil, true
	case len(item) > 0 && item[0] == '[':
		if json.Unmarshal(item, &ids) != nil || len(ids) == 0 {
			return nil, nil, false
		}
		return nil, ids, true
	}
	return nil, nil, false
}
