package caddymodule

import (
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestPromptOfOne: a batch of one is its element; anything else is not a
// prompt the gateway can route by.
func TestPromptOfOne(t *testing.T) {
	for _, c := range []struct {
		raw  string
		text string
		ids  []uint32
		ok   bool
	}{
		{`["hello"]`, `"hello"`, nil, true},
		{` [ [1, 2, 3] ] `, "", []uint32{1, 2, 3}, true},
		{`["a","b"]`, "", nil, false},
		{`[[1,2],"x"]`, "", nil, false},
		{`[]`, "", nil, false},
		{`[[]]`, "", nil, false},
		{`[[1.5]]`, "", nil, false},
		// pydantic's lax list[list[int]]: vLLM prefills these as one prompt.
		{`[[7.0, 8.0]]`, "", []uint32{7, 8}, true},
		{`[["7", " 8 "]]`, "", []uint32{7, 8}, true},
		{`[[true, 2]]`, "", []uint32{1, 2}, true},
		{`[["a"]]`, "", nil, false},
		{`[[-1.0]]`, "", nil, false},
		{`[7]`, "", nil, false},
		{`"x"`, "", nil, false},
	} {
		text, ids, ok := promptOfOne(selection.RawJSON(c.raw), true)
		if ok != c.ok || string(text) != c.text || !slices.Equal(ids, c.ids) {
			t.Errorf("%s: %q %v %v, want %q %v %v", c.raw, text, ids, ok, c.text, c.ids, c.ok)
		}
		// Strictly (SGLang's /generate), only JSON integers are ids.
		if _, ids, ok := promptOfOne(selection.RawJSON(c.raw), false); ok && ids != nil && strings.ContainsAny(c.raw, `."tr`) {
			t.Errorf("%s read strictly: %v", c.raw, ids)
		}
	}
}

// TestPromptOfOneReadsOneElement: a batch of a million elements is
// refused after its first, not decoded whole (which allocated some 65
// times the body). The least of three runs is taken: TotalAlloc counts
// the whole process.
func TestPromptOfOneReadsOneElement(t *testing.T) {
	raw := selection.RawJSON(`["x"` + strings.Repeat(",0", 1<<20) + `]`)
	least := leastAlloc(func() {
		if _, _, ok := promptOfOne(raw, true); ok {
			t.Fatal("a batch of many taken as a batch of one")
		}
	})
	if least > uint64(len(raw)) {
		t.Errorf("refusing a %d-byte batch allocated %d bytes", len(raw), least)
	}
}

// leastAlloc is the least the process allocated over three runs of f:
// TotalAlloc counts every goroutine, so the least is f's own nearest.
func leastAlloc(f func()) uint64 {
	least := ^uint64(0)
	for range 3 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	return least
}

// TestSoleElement: the element of a one-element array of a string, a
// scalar or a flat array; nothing for any other value.
func TestSoleElement(t *testing.T) {
	for raw, want := range map[string]string{
		`["a\"]b"]`: `"a\"]b"`, `[ true ]`: `true`, `[-1.5e3]`: `-1.5e3`, `[null]`: `null`, `[[1, 2]]`: `[1, 2]`,
		`[]`: "", `[1,2]`: "", `[{"a":1}]`: "", `[[[1]]]`: "", `"x"`: "", `[true] x`: "",
	} {
		item, ok := soleElement([]byte(raw))
		if string(item) != want || ok != (want != "") {
			t.Errorf("%s: %q %v, want %q", raw, item, ok, want)
		}
	}
}
