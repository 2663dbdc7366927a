package selection

import (
	"bytes"
	"fmt"
	"unicode/utf8"

	json "github.com/goccy/go-json"
)

// scanner walks a JSON document by hand. It validates what it skips well
// enough to tell a syntax error (400) from a shape error (422).
type scanner struct {
	b []byte
	i int
}

func isSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

func (s *scanner) ws() {
	for s.i < len(s.b) && isSpace(s.b[s.i]) {
		s.i++
	}
}

// end checks that nothing but whitespace follows the document.
func (s *scanner) end() error {
	s.ws()
	if s.i != len(s.b) {
		return s.syntax("trailing characters")
	}
	return nil
}

// position returns the 1-based line and column of offset i, as serde reports.
func (s *scanner) position(i int) (line, col int) {
	line, col = 1, 0
	for k := 0; k < i && k < len(s.b); k++ {
		if s.b[k] == '\n' {
			line++
			col = 0
		} else {
			col++
		}
	}
	return line, col + 1
}

func (s *scanner) syntax(msg string) error {
	l, c := s.position(s.i)
	return &Error{Kind: KindMalformed, Msg: fmt.Sprintf("%s%s at line %d column %d", syntaxPrefix, msg, l, c)}
}

func (s *scanner) shape(msg string) error {
	l, c := s.position(s.i)
	return &Error{Kind: KindUnprocessable, Msg: fmt.Sprintf("%s%s at line %d column %d", shapePrefix, msg, l, c)}
}

// key reads an object key and returns its bytes, unescaped if needed.
func (s *scanner) key() ([]byte, error) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, s.syntax("key must be a string")
	}
	start := s.i + 1
	escaped, err := s.skipString()
	if err != nil {
		return nil, err
	}
	raw := s.b[start : s.i-1]
	if !escaped {
		return raw, nil
	}
	var str string
	if err := json.Unmarshal(s.b[start-1:s.i], &str); err != nil {
		return nil, s.syntax("invalid escape in key")
	}
	return []byte(str), nil
}

// skipString moves past a string starting at the opening quote. It reports
// whether the string held escapes.
func (s *scanner) skipString() (escaped bool, err error) {
	s.i++ // opening quote
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return escaped, nil
		case c == '\\':
			escaped = true
			if s.i+1 >= len(s.b) {
				return escaped, s.syntax("EOF while parsing a string")
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) {
					return escaped, s.syntax("EOF while parsing a string")
				}
				for _, h := range s.b[s.i+2 : s.i+6] {
					if !isHex(h) {
						return escaped, s.syntax("invalid escape")
					}
				}
				s.i += 6
			default:
				return escaped, s.syntax("invalid escape")
			}
		case c < 0x20:
			return escaped, s.syntax("control character (\\u0000-\\u001F) found while parsing a string")
		case c < utf8.RuneSelf:
			s.i++
		default:
			r, n := utf8.DecodeRune(s.b[s.i:])
			if r == utf8.RuneError && n <= 1 {
				return escaped, s.syntax("invalid unicode code point")
			}
			s.i += n
		}
	}
	return escaped, s.syntax("EOF while parsing a string")
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// maxDepth bounds nesting so a hostile body cannot exhaust the stack.
const maxDepth = 128

// skipValue moves past one JSON value, checking its syntax.
func (s *scanner) skipValue(depth int) error {
	if depth > maxDepth {
		return s.syntax("recursion limit exceeded")
	}
	if s.i >= len(s.b) {
		return s.syntax("EOF while parsing a value")
	}
	switch c := s.b[s.i]; {
	case c == '"':
		_, err := s.skipString()
		return err
	case c == '{':
		s.i++
		s.ws()
		if s.i < len(s.b) && s.b[s.i] == '}' {
			s.i++
			return nil
		}
		for {
			s.ws()
			if s.i >= len(s.b) || s.b[s.i] != '"' {
				return s.syntax("key must be a string")
			}
			if _, err := s.skipString(); err != nil {
				return err
			}
			s.ws()
			if s.i >= len(s.b) || s.b[s.i] != ':' {
				return s.syntax("expected `:`")
			}
			s.i++
			s.ws()
			if err := s.skipValue(depth + 1); err != nil {
				return err
			}
			if closed, err := s.next('}'); closed || err != nil {
				return err
			}
		}
	case c == '[':
		s.i++
		s.ws()
		if s.i < len(s.b) && s.b[s.i] == ']' {
			s.i++
			return nil
		}
		for {
			s.ws()
			if err := s.skipValue(depth + 1); err != nil {
				return err
			}
			if closed, err := s.next(']'); closed || err != nil {
				return err
			}
		}
	case c == '-' || c >= '0' && c <= '9':
		_, err := s.number()
		return err
	default:
		return s.literal()
	}
}

// next moves past the separator after a container's element and reports
// whether it was the container's closing byte.
func (s *scanner) next(closing byte) (bool, error) {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == ',' {
		s.i++
		return false, nil
	}
	if s.i < len(s.b) && s.b[s.i] == closing {
		s.i++
		return true, nil
	}
	return false, s.syntax("expected `,` or `" + string(closing) + "`")
}

// literal moves past true, false or null.
func (s *scanner) literal() error {
	for _, lit := range []string{"true", "false", "null"} {
		if bytes.HasPrefix(s.b[s.i:], []byte(lit)) {
			s.i += len(lit)
			return nil
		}
	}
	return s.syntax("expected value")
}

// number moves past a JSON number and reports whether it was a plain
// non-negative integer (no sign, fraction or exponent).
func (s *scanner) number() (plain bool, err error) {
	plain = true
	if s.b[s.i] == '-' {
		plain = false
		s.i++
	}
	if s.i >= len(s.b) || s.b[s.i] < '0' || s.b[s.i] > '9' {
		return false, s.syntax("invalid number")
	}
	if s.b[s.i] == '0' {
		s.i++
	} else {
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
		}
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		plain = false
		s.i++
		if s.i >= len(s.b) || s.b[s.i] < '0' || s.b[s.i] > '9' {
			return false, s.syntax("invalid number")
		}
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		plain = false
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if s.i >= len(s.b) || s.b[s.i] < '0' || s.b[s.i] > '9' {
			return false, s.syntax("invalid number")
		}
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
		}
	}
	return plain, nil
}

// kindOf names the JSON type of a value from its first byte, as serde
// does in its "invalid type" errors.
func kindOf(c byte) string {
	switch {
	case c == '"':
		return "string"
	case c == '[':
		return "sequence"
	case c == '{':
		return "map"
	case c == 't' || c == 'f':
		return "boolean"
	case c == 'n':
		return "null"
	}
	return "number"
}
