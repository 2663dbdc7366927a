package main

import (
	"encoding/json"
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
