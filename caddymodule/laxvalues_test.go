package caddymodule

import (
	"math"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestLaxBool: what pydantic's lax mode takes for a bool, and what it
// refuses (read as absent).
func TestLaxBool(t *testing.T) {
	for in, want := range map[string]struct{ b, ok bool }{
		`true`: {true, true}, `false`: {false, true}, ` true `: {true, true},
		`1`: {true, true}, `0`: {false, true}, `1.0`: {true, true}, `0.0`: {false, true},
		`"true"`: {true, true}, `"True"`: {true, true}, `"YES"`: {true, true}, `"on"`: {true, true},
		`"t"`: {true, true}, `"y"`: {true, true}, `"1"`: {true, true}, `"tru\u0065"`: {true, true},
		`"false"`: {false, true}, `"no"`: {false, true}, `"off"`: {false, true}, `"f"`: {false, true},
		`"n"`: {false, true}, `"0"`: {false, true},
		``: {false, false}, `null`: {false, false}, `2`: {false, false}, `0.5`: {false, false},
		`"maybe"`: {false, false}, `""`: {false, false}, `[true]`: {false, false}, `{}`: {false, false},
	} {
		b, ok := laxBool(selection.RawJSON(in))
		if b != want.b || ok != want.ok {
			t.Errorf("%s: %v %v, want %v %v", in, b, ok, want.b, want.ok)
		}
	}
}

// TestLaxInt: what pydantic's lax mode takes for an int, and what it
// refuses (read as absent).
func TestLaxInt(t *testing.T) {
	type result struct {
		n  int64
		ok bool
	}
	for in, want := range map[string]result{
		`2`: {2, true}, `-1`: {-1, true}, `2.0`: {2, true}, `2e3`: {2000, true},
		`true`: {1, true}, `false`: {0, true},
		`"2"`: {2, true}, `" 2 "`: {2, true}, `"2.0"`: {2, true}, `"-1"`: {-1, true}, `"+3"`: {3, true},
		``: {0, false}, `null`: {0, false}, `2.5`: {0, false}, `1e300`: {0, false},
		`"2.5"`: {0, false}, `"two"`: {0, false}, `"2."`: {0, false}, `""`: {0, false}, `[2]`: {0, false},
		// Python's digit separators, which pydantic's str-to-int takes.
		`"1_00"`: {100, true}, `" 1_0 "`: {10, true}, `"1_0.0"`: {10, true}, `"0_1"`: {1, true}, `"+1_0"`: {10, true},
		`"_1"`: {0, false}, `"1_"`: {0, false}, `"1__0"`: {0, false}, `"+_1"`: {0, false}, `"1_.0"`: {0, false},
		`"-1_0"`: {-10, true}, `"9_223_372_036_854_775_807"`: {math.MaxInt64, true}, `"9_223_372_036_854_775_808"`: {0, false},
		`"-9_223_372_036_854_775_808"`: {math.MinInt64, true}, `"-9_223_372_036_854_775_809"`: {0, false},
		`"99_999_999_999_999_999_999"`: {0, false}, `"1_a"`: {0, false}, `"-_"`: {0, false}, `"0_0_0"`: {0, true},
		// Escaped, decoded first (laxIDList reads unescaped strings in place).
		`"\u0031_0"`: {10, true}, `"\u00a01\u00a0"`: {1, true},
	} {
		n, ok := laxInt(selection.RawJSON(in))
		if n != want.n || ok != want.ok {
			t.Errorf("%s: %d %v, want %d %v", in, n, ok, want.n, want.ok)
		}
	}
}
