package caddymodule

import (
	"bytes"
	"math"
	"strconv"
	"unsafe"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// laxIDList reads a /v1/completions prompt, a flat JSON array that the
// token decoder did not take (it takes JSON integers only), as vLLM's
// pydantic reads it. The prompt is a union of list[int], list[list[int]],
// str and list[str], read in pydantic's smart mode: a list of strings only
// is a batch of text prompts (list[str], strictly); any other list of
// scalars is list[int] in lax mode, each element read as laxInt reads an
// int (7.0, 1e3, "8", true). ok is false when the list is not such a
// prompt of token ids (an element that is not an integer, or one out of a
// token id's range, which the engine refuses), or holds a list or an
// object. A client writing floats (a numpy array's tolist()) had its
// prompt routed by load.
func laxIDList(raw selection.RawJSON) (ids []uint32, ok bool) {
	return laxIDs(raw, true)
}

// laxIDs is laxIDList; a list of strings only is refused when
// textIsBatch (the prompt itself: list[str] takes it), and read as ids
// when not (a batch's element: only list[list[int]] can take a list).
func laxIDs(raw selection.RawJSON, textIsBatch bool) (ids []uint32, ok bool) {
	b := bytes.TrimSpace(raw)
	if len(b) < 2 || b[0] != '[' {
		return nil, false
	}
	// The ids are allocated once, at their count: grown by append, they
	// cost five times their size (16 bytes a byte of a list of floats).
	// Without a string in the list, its commas count its elements; with
	// one, a first pass counts them and sees that they are not all
	// strings (a batch of texts).
	var n int
	if bytes.IndexByte(b, '"') < 0 {
		n = bytes.Count(b, []byte{','}) + 1
	} else {
		allText := true
		for i := range scalars(b) {
			if i < 0 {
				return nil, false // a list or an object
			}
			n++
			allText = allText && b[i] == '"'
		}
		if allText && textIsBatch {
			return nil, false
		}
	}
	ids = make([]uint32, 0, n)
	for i, end := range scalars(b) {
		if i < 0 {
			return nil, false // a list or an object
		}
		id, ok := laxID(b[i:end])
		if !ok {
			return nil, false
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return nil, false
	}
	return ids, true
}

// scalars yields where each element of the list b starts and ends; -1,
// and no more, at an element that is a list or an object. b is a JSON
// list, space trimmed.
func scalars(b []byte) func(yield func(start, end int) bool) {
	return func(yield func(start, end int) bool) {
		for i := skipSpace(b, 1); i < len(b) && b[i] != ']'; {
			end := scalarEnd(b, i)
			if end < 0 {
				yield(-1, -1)
				return
			}
			if !yield(i, end) {
				return
			}
			if i = skipSpace(b, end); i < len(b) && b[i] == ',' {
				i = skipSpace(b, i+1)
			}
		}
	}
}

// scalarEnd is the index just past the scalar value that starts at b[i]
// (a string, a number, true, false or null), or -1 when a list or an
// object starts there. b is valid JSON.
func scalarEnd(b []byte, i int) int {
	switch b[i] {
	case '[', '{':
		return -1
	case '"':
		for i++; i < len(b) && b[i] != '"'; i++ {
			if b[i] == '\\' {
				i++ // the escaped byte
			}
		}
		return i + 1
	}
	for i < len(b) && b[i] != ',' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		i++
	}
	return i
}

// laxID is item, one scalar, as a token id: laxInt's reading, in
// uint32's range. A number is parsed in place: a list of millions costs
// no allocation per element.
func laxID(item []byte) (uint32, bool) {
	if c := item[0]; c == '-' || c >= '0' && c <= '9' {
		if id, ok := plainID(item); ok {
			return id, true
		}
		f, err := strconv.ParseFloat(unsafe.String(&item[0], len(item)), 64)
		if err != nil || f != math.Trunc(f) || f < 0 || f > math.MaxUint32 {
			return 0, false
		}
		return uint32(f), true
	}
	var n int64
	var ok bool
	var buf [64]byte
	if text, plain := plainText(item); plain {
		n, ok = laxIntText(text) // read in place: no string made an element
	} else if text, short := unescapeShort(item, buf[:]); short {
		n, ok = laxIntText(unsafe.String(unsafe.SliceData(text), len(text)))
	} else {
		n, ok = laxInt(selection.RawJSON(item))
	}
	if !ok || n < 0 || n > math.MaxUint32 {
		return 0, false
	}
	return uint32(n), true
}

// plainID reads the common forms of a number laxID takes, digits with
// an optional fraction of zeros ("123", "123.0"), without ParseFloat's
// cost; ok is false for any other (laxID parses it then).
func plainID(item []byte) (uint32, bool) {
	var n uint64
	i := 0
	for ; i < len(item) && item[i] >= '0' && item[i] <= '9'; i++ {
		if n = n*10 + uint64(item[i]-'0'); n > math.MaxUint32 {
			return 0, false
		}
	}
	if i == 0 {
		return 0, false
	}
	if i < len(item) && item[i] == '.' {
		for i++; i < len(item) && item[i] == '0'; i++ {
		}
	}
	return uint32(n), i == len(item)
}

// plainText is the text of item, a JSON string, read in place; ok is
// false for anything else, or a string with an escape (decoded then).
func plainText(item []byte) (string, bool) {
	if len(item) < 2 || item[0] != '"' || bytes.IndexByte(item, '\\') >= 0 {
		return "", false
	}
	if len(item) == 2 {
		return "", true
	}
	return unsafe.String(&item[1], len(item)-2), true
}
