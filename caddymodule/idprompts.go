package caddymodule

import (
	"bytes"
	"net/http"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// longestIDPrompt is the length, in the tokens the engine prefills, of the
// longest prompt the request gives as token ids; ok is false when it gives
// none. It is read for a request routed by load (a batch of prompts, one
// whose cache the engine will not read, an SGLang extra_key): such a
// request is not hashed, but vLLM and SGLang still refuse a prompt past a
// worker's context, so it goes only to the workers whose context fits its
// longest prompt (contextlimit.go). A batch's text prompts are not counted
// (only a worker can tell their length): the figure is a lower bound, which
// never keeps a request from a worker that would have taken it.
func (o *openAIRequest) longestIDPrompt(r *http.Request) (n int, ok bool) {
	switch {
	case isGenerate(r):
		switch {
		case o.Text.IsSet():
			return 0, false // both: SGLang versions refuse or read one
		case o.inputIDs != nil:
			n, ok = len(o.inputIDs), true
		case o.RawInputIDs.IsArray():
			n, ok = longestIDList(o.RawInputIDs)
		}
	case o.TokenIDs != nil:
		n, ok = len(o.TokenIDs), true
	case isChat(r):
		return 0, false
	case o.promptTokens != nil:
		n, ok = len(o.promptTokens), true
	case o.RawPrompt.IsArray():
		n, ok = longestIDList(o.RawPrompt)
	}
	if !ok {
		return 0, false
	}
	return o.truncatedLength(n), true
}

// longestIDList is the length of the longest list in raw, a batch of
// prompts (lists of token ids, or strings, which are skipped); ok is false
// when it holds no list. raw is valid JSON (the request decoded). It is
// scanned, not decoded: a batch can hold millions of ids, and only their
// count is wanted.
func longestIDList(raw selection.RawJSON) (longest int, ok bool) {
	longest, ok, _ = scanIDLists(raw)
	return longest, ok
}

// scanIDLists is longestIDList, and how many bytes its byte searches read
// besides the scan's own one pass (a test holds it to a few times the
// input: a search from each object of a batch to the batch's end read the
// rest of the body once an element, 5 s of CPU for 1 MiB of {}).
func scanIDLists(raw selection.RawJSON) (longest int, ok bool, searched int) {
	depth := 0
	inList := false // inside a list at depth 2: a prompt of ids
	count, seen := 0, false
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; c {
		case '"':
			for i++; i < len(raw) && raw[i] != '"'; i++ {
				if raw[i] == '\\' {
					i++ // the escaped byte
				}
			}
			seen = true
		case '[', '{':
			depth++
			if depth == 2 {
				inList, count, seen = c == '[', 0, false
				if !inList {
					break // an object: its end is no ']'
				}
				n, end, read, flat := countFlatList(raw, i)
				searched += read
				if flat {
					longest, ok, inList = max(longest, n), true, false
					i, depth = end, 1
				}
			}
		case ']', '}':
			if depth == 2 && inList {
				if seen {
					count++
				}
				longest, ok, inList = max(longest, count), true, false
			}
			depth--
		case ',':
			if depth == 2 {
				count++
			}
		case ' ', '\t', '\n', '\r':
		default:
			seen = true
		}
	}
	return longest, ok, searched
}

// countFlatList counts the elements of the list that opens at raw[open],
// when it holds no string, list or object (a prompt of ids), with the
// byte search and count the runtime does many bytes at a time; end is the
// index of its closing bracket, read the bytes its searches read. ok is
// false for any other list, left to the byte-by-byte scan. Its searches
// end at the list's own end at the latest (a list closes with the first
// ']' outside a string, and one inside a string stops them sooner).
func countFlatList(raw []byte, open int) (n, end, read int, ok bool) {
	size := bytes.IndexByte(raw[open+1:], ']')
	if size < 0 {
		return 0, 0, len(raw) - open - 1, false
	}
	read = size + 1
	items := raw[open+1 : open+1+size]
	for _, c := range []byte{'"', '[', '{'} {
		if at := bytes.IndexByte(items, c); at >= 0 {
			return 0, 0, read + at + 1, false
		}
		read += len(items)
	}
	if len(bytes.TrimSpace(items)) > 0 {
		n = bytes.Count(items, []byte{','}) + 1
	}
	return n, open + 1 + size, read + len(items), true
}
