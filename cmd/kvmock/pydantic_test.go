package main

import (
	"encoding/json"
	"slices"
	"testing"
)

// TestPyInt reads integers as pydantic's lax mode does, Python's digit
// separators included.
func TestPyInt(t *testing.T) {
	for in, want := range map[string]int{`3`: 3, `3.0`: 3, `true`: 1, `"3"`: 3, `" 3 "`: 3, `"3.00"`: 3, `"1_00"`: 100, `"1_0.0"`: 10} {
		var n pyInt
		if err := json.Unmarshal([]byte(in), &n); err != nil || int(n) != want {
			t.Errorf("%s: %d %v, want %d", in, n, err, want)
		}
	}
	for _, in := range []string{`3.5`, `"3.5"`, `"three"`, `"_1"`, `"1_"`, `"1__0"`, `null`, `[]`} {
		var n pyInt
		if err := json.Unmarshal([]byte(in), &n); err == nil {
			t.Errorf("%s was read as %d", in, n)
		}
	}
}

// TestLaxTokenIDs: a prompt list read as pydantic reads vLLM's union.
func TestLaxTokenIDs(t *testing.T) {
	for _, tc := range []struct {
		raw    string
		ids    []uint32
		isIDs  bool
		failed bool
	}{
		{`[7.0, 8, "9", true]`, []uint32{7, 8, 9, 1}, true, false},
		{`["7", "8"]`, nil, false, false}, // list[str], strictly
		{`[7.5]`, nil, true, true},
		{`[7, "x"]`, nil, true, true},
		{`[7, null]`, nil, true, true},
		{`[-1.0]`, nil, true, true},
		{`[[7], [8]]`, nil, false, false},
	} {
		var items []json.RawMessage
		if err := json.Unmarshal([]byte(tc.raw), &items); err != nil {
			t.Fatal(err)
		}
		ids, isIDs, err := laxTokenIDs(items, false)
		if isIDs != tc.isIDs || (err != nil) != tc.failed || !slices.Equal(ids, tc.ids) {
			t.Errorf("%s: %v %v %v", tc.raw, ids, isIDs, err)
		}
	}
}
