package caddymodule

import (
	"bytes"
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
		s = strings.TrimSpace(s)
		if whole, frac, found := strings.Cut(s, "."); found && frac != "" && strings.Trim(frac, "0") == "" {
			s = whole
		}
		if s, ok = pyUnderscores(s); !ok {
			return 0, false
		}
		n, err := strconv.ParseInt(s, 10, 64)
		return n, err == nil
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

// pyUnderscores drops the underscores Python's int() takes in a string of
// digits, each between two digits ("1_000"); ok is false for any other
// ("_1", "1_", "1__0").
func pyUnderscores(s string) (string, bool) {
	if !strings.Contains(s, "_") {
		return s, true
	}
	digit := func(c byte) bool { return c >= '0' && c <= '9' }
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '_' {
			b = append(b, s[i])
			continue
		}
		if i == 0 || i+1 == len(s) || !digit(s[i-1]) || !digit(s[i+1]) {
			return "", false
		}
	}
	return string(b), true
}
