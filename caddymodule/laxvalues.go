package caddymodule

import (
	"bytes"
	"math"
	"strconv"
	"strings"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// vLLM reads its requests with pydantic in its default lax mode, which
// takes more than JSON's own type for a boolean or an integer member. The
// members whose value changes what the engine prefills or reads from its
// cache (echo, truncate_prompt_tokens) and whether a stream gets usage
// (stream) are read here as pydantic reads them, so that the gateway
// predicts what the engine does with them. A value pydantic refuses the
// engine answers with a 400; the gateway reads it as absent.

// laxBool is v as pydantic reads a bool: JSON's true and false, the
// numbers 0 and 1 (1.0 too), and the strings it names (any case:
// "true"/"false", "yes"/"no", "on"/"off", "t"/"f", "y"/"n", "1"/"0").
// ok is false for anything else, absent or null included.
func laxBool(v selection.RawJSON) (b, ok bool) {
	t := bytes.TrimSpace(v)
	switch {
	case len(t) == 0:
		return false, false
	case bytes.Equal(t, []byte("true")):
		return true, true
	case bytes.Equal(t, []byte("false")):
		return false, true
	case t[0] == '"':
		s, isText := v.Text()
		if !isText {
			return false, false
		}
		switch strings.ToLower(s) {
		case "true", "yes", "on", "t", "y", "1":
			return true, true
		case "false", "no", "off", "f", "n", "0":
			return false, true
		}
		return false, false
	}
	f, err := strconv.ParseFloat(string(t), 64)
	switch {
	case err != nil:
		return false, false
	case f == 1:
		return true, true
	case f == 0:
		return false, true
	}
	return false, false
}

// laxTrue reports whether v is true as pydantic reads a bool.
func laxTrue(v selection.RawJSON) bool {
	b, ok := laxBool(v)
	return ok && b
}

// laxInt is v as pydantic reads an int: a JSON integer, a number with no
// fraction (2.0), true and false (1 and 0), or a string of an integer,
// blanks around it, underscores between digits and a fraction of zeros
// allowed (" 2 ", "1_000", "2.0"). ok is
// false for anything else, absent or null included.
func laxInt(v selection.RawJSON) (n int64, ok bool) {
	t := bytes.TrimSpace(v)
	switch {
	case len(t) == 0:
		return 0, false
	case bytes.Equal(t, []byte("true")):
		return 1, true
	case bytes.Equal(t, []byte("false")):
		return 0, true
	case t[0] == '"':
		s, isText := v.Text()
		if !isText {
			return 0, false
		}
		return laxIntText(s)
	}
	if n, err := strconv.ParseInt(string(t), 10, 64); err == nil {
		return n, true
	}
	f, err := strconv.ParseFloat(string(t), 64)
	if err != nil || f < -(1<<62) || f > 1<<62 || f != float64(int64(f)) {
		return 0, false
	}
	return int64(f), true
}

// laxIntText is a string's text as pydantic's lax int reads it: Python's
// int() of it (space around, a sign, underscores between digits), after
// a fraction of zeros is cut ("7.0").
func laxIntText(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	if whole, frac, found := strings.Cut(s, "."); found && frac != "" && strings.Trim(frac, "0") == "" {
		s = whole
	}
	if strings.Contains(s, "_") {
		return pyUnderscored(s)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// pyUnderscored is Python's int() of s, a sign and digits with
// underscores, each between two digits ("1_000"); ok is false for any
// other ("_1", "1_", "1__0") and past int64. Read in place: a prompt of
// millions of such ids made a string of each.
func pyUnderscored(s string) (int64, bool) {
	neg := false
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg, s = s[0] == '-', s[1:]
	}
	digit := func(c byte) bool { return c >= '0' && c <= '9' }
	var n uint64
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '_':
			if i == 0 || i+1 == len(s) || !digit(s[i-1]) || !digit(s[i+1]) {
				return 0, false
			}
		case digit(c):
			if n > (1<<63)/10 {
				return 0, false // past int64 (and, unchecked, past uint64)
			}
			if n = n*10 + uint64(c-'0'); n > 1<<63 {
				return 0, false
			}
		default:
			return 0, false
		}
	}
	if len(s) == 0 || !neg && n > math.MaxInt64 {
		return 0, false
	}
	if neg {
		return -int64(n), true // 1<<63 negated is MinInt64
	}
	return int64(n), true
}
