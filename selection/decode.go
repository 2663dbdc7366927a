package selection

import (
	"bytes"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"sync"
	"unicode/utf8"
	"unsafe"

	json "github.com/goccy/go-json"
)

// Decoding of request bodies. The prompt's token_ids can be 100k elements; it
// is parsed here in one pass straight into a []uint32, and everything else in
// the body (a few small members) goes to goccy/go-json. A body without
// token_ids goes to goccy as it is; a body with it goes as a copy of its other
// members, so goccy never walks the token array.

// promptCarrier is a request type that embeds Prompt.
type promptCarrier interface{ prompt() *Prompt }

// Text prefixes of axum's JSON extractor rejections (spec §1.1).
const (
	syntaxPrefix = "Failed to parse the request body as JSON: "
	shapePrefix  = "Failed to deserialize the JSON body into the target type: "
)

// ShapeError is a 422 with axum's text for well-formed JSON of the wrong
// shape, for the checks a caller makes after DecodeJSON (a missing field).
func ShapeError(msg string) *Error { return &Error{Kind: KindUnprocessable, Msg: shapePrefix + msg} }

var remainderPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// PromptTokenCarrier is implemented by request types that also take an
// integer-array "prompt" (OpenAI's completions) through the fast token
// decoder. PromptTokens returns where to put them; its current capacity is
// reused. A "prompt" that is not an integer array (text, a batch) is left
// to the generic decoder.
type PromptTokenCarrier interface {
	PromptTokens() *[]uint32
}

// DecodeJSON decodes a request body into v (a *SelectRequest,
// *ReservationRequest, *ScoreRequest or any type embedding Prompt). The token
// slice already in v is reused when it has room, so a caller that pools its
// request values decodes without allocating per token. Errors are *Error of
// kind KindMalformed (400) or KindUnprocessable (422) with axum's texts.
func DecodeJSON(body []byte, v promptCarrier) error {
	p := v.prompt()
	tokens := p.TokenIDs[:0]
	p.TokenIDs = nil
	ptc, _ := v.(PromptTokenCarrier)
	var promptDst *[]uint32
	if ptc != nil {
		promptDst = ptc.PromptTokens()
		*promptDst = (*promptDst)[:0]
	}

	sc := scanner{b: body}
	sc.ws()
	if sc.i >= len(body) || body[sc.i] != '{' {
		// Not an object: let goccy classify it (syntax error or wrong type).
		return goccyDecode(body, v)
	}
	sc.i++
	var cut [2][2]int // members parsed here, removed before goccy: token_ids, prompt
	ncut := 0
	seenTokens, found, promptFound := false, false, false
	first := true
	for {
		sc.ws()
		if sc.i >= len(body) {
			return sc.syntax("EOF while parsing an object")
		}
		if first && body[sc.i] == '}' {
			sc.i++
			break
		}
		first = false
		keyStart := sc.i
		key, err := sc.key()
		if err != nil {
			return err
		}
		sc.ws()
		if sc.i >= len(body) || body[sc.i] != ':' {
			return sc.syntax("expected `:`")
		}
		sc.i++
		sc.ws()
		switch {
		case isTokenKey(key):
			if seenTokens {
				return sc.shape("duplicate field `token_ids`")
			}
			var null bool
			tokens, null, err = sc.tokenArray(tokens, "token_ids")
			if err != nil {
				return err
			}
			seenTokens, found = true, !null
			cut[ncut] = [2]int{keyStart, sc.i}
			ncut++
		case promptDst != nil && !promptFound && sc.i < len(body) && body[sc.i] == '[' && string(key) == "prompt":
			// Try it as token ids; a prompt of strings or a batch of
			// prompts stays in the body for the generic decoder.
			start := sc.i
			if toks, _, err := sc.tokenArray(*promptDst, "prompt"); err == nil {
				*promptDst, promptFound = toks, true
				cut[ncut] = [2]int{keyStart, sc.i}
				ncut++
				break
			}
			sc.i = start
			if err := sc.skipValue(0); err != nil {
				return err
			}
		default:
			if err := sc.skipValue(0); err != nil {
				return err
			}
		}
		sc.ws()
		if sc.i >= len(body) {
			return sc.syntax("EOF while parsing an object")
		}
		if body[sc.i] == ',' {
			sc.i++
			continue
		}
		if body[sc.i] == '}' {
			sc.i++
			break
		}
		return sc.syntax("expected `,` or `}`")
	}
	sc.ws()
	if sc.i != len(body) {
		return sc.syntax("trailing characters")
	}
	if ncut == 0 {
		if err := goccyDecode(body, v); err != nil {
			return err
		}
		p.TokenIDs = nil
		if promptDst != nil {
			*promptDst = nil // no integer-array prompt: not a reused buffer's leftovers
		}
		return nil
	}
	// Hand goccy the body without the members parsed here.
	bufp := remainderPool.Get().(*[]byte)
	rest := (*bufp)[:0]
	if ncut == 1 {
		rest = removeMember(rest, body, cut[0][0], cut[0][1])
	} else {
		// Remove the later member first, from a copy, then the earlier.
		first, second := cut[0], cut[1]
		tmp := removeMember(nil, body, second[0], second[1])
		rest = removeMember(rest, tmp, first[0], first[1])
	}
	err := goccyDecode(rest, v)
	*bufp = rest
	remainderPool.Put(bufp)
	if err != nil {
		return err
	}
	if found {
		p.TokenIDs = tokens
	} else {
		p.TokenIDs = nil
	}
	if !promptFound && promptDst != nil {
		*promptDst = nil
	}
	return nil
}

// removeMember appends body without the object member [start, end) to dst.
func removeMember(dst, body []byte, start, end int) []byte {
	// Look back for the comma before the member; if there is none, the
	// member is first and the comma after it must go instead.
	j := start - 1
	for j >= 0 && isSpace(body[j]) {
		j--
	}
	if body[j] == ',' {
		dst = append(dst, body[:j]...)
		return append(dst, body[end:]...)
	}
	k := end
	for k < len(body) && isSpace(body[k]) {
		k++
	}
	if k < len(body) && body[k] == ',' {
		k++
	}
	dst = append(dst, body[:start]...)
	return append(dst, body[k:]...)
}

func isTokenKey(key []byte) bool {
	return len(key) == len("token_ids") && bytes.EqualFold(key, []byte("token_ids"))
}

// goccyDecode decodes body into v and maps goccy's errors to statuses.
func goccyDecode(body []byte, v any) error {
	err := json.Unmarshal(body, v)
	if err == nil {
		return nil
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return &Error{Kind: KindMalformed, Msg: syntaxPrefix + err.Error()}
	}
	var fe *fieldError
	if errors.As(err, &fe) {
		return &Error{Kind: KindUnprocessable, Msg: shapePrefix + fe.Error()}
	}
	return &Error{Kind: KindUnprocessable, Msg: shapePrefix + err.Error()}
}

// fieldError is a shape error found by our own element decoders.
type fieldError struct{ msg string }

func (e *fieldError) Error() string { return e.msg }

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

// tokenArray parses a JSON array of u32 token ids at s.i into dst (reused),
// in one pass. null yields (dst, true, nil). An element that is not an
// integer in [0, 2^32-1] is a shape error naming field and its index.
func (s *scanner) tokenArray(dst []uint32, field string) ([]uint32, bool, error) {
	b := s.b
	i := s.i
	if i < len(b) && b[i] == 'n' {
		if err := s.literal(); err != nil {
			return dst, false, err
		}
		if !bytes.Equal(b[i:s.i], []byte("null")) {
			return dst, false, s.shape(fmt.Sprintf("%s: invalid type: boolean, expected a sequence", field))
		}
		return dst, true, nil
	}
	if i >= len(b) || b[i] != '[' {
		if err := s.skipValue(0); err != nil {
			return dst, false, err
		}
		s.i = i
		return dst, false, s.shape(field + ": invalid type: " + kindOf(b[i]) + ", expected a sequence")
	}
	// Size the slice once: every element takes at least two bytes (a digit
	// and a separator), so this bound is never exceeded and append never
	// reallocates per token.
	if bound := (len(b)-i)/2 + 1; cap(dst) < bound {
		dst = make([]uint32, 0, bound)
	}
	i++
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	if i < len(b) && b[i] == ']' {
		s.i = i + 1
		return dst, false, nil
	}
	for {
		// Fast path: eight bytes at a time (SWAR). They hold every token id
		// below 10^7 and the comma after it, which is nearly every element.
		// The slice has room for every element (see the bound above), so
		// it is written by index and its length set once.
		k, out := len(dst), dst[:cap(dst)]
		base, last := unsafe.Pointer(unsafe.SliceData(b)), len(b)-8
		for littleEndian && i <= last && k < len(out) {
			// In bounds (i <= len(b)-8): a plain load, no bounds check.
			x := *(*uint64)(unsafe.Add(base, i))
			if byte(x)-'1' > 8 {
				break // not a digit 1-9 (a 0, a space, or an error)
			}
			n := digitRun(x)
			if n == 8 || byte(x>>(8*n)) != ',' {
				break
			}
			out[k] = uint32(parseDigits(x, n))
			k++
			i += n + 1
		}
		dst = out[:k]
		// Slow path: spaces, long numbers, the last element, the last
		// bytes of the body, and every error.
		for i < len(b) && isSpace(b[i]) {
			i++
		}
		if i < len(b) && b[i] >= '1' && b[i] <= '9' {
			v := uint64(b[i] - '0')
			i++
			for i < len(b) {
				d := b[i] - '0'
				if d > 9 {
					break
				}
				v = v*10 + uint64(d)
				if v > 0xFFFFFFFF {
					return dst, false, s.tokenError(i, field, len(dst))
				}
				i++
			}
			if i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E') {
				return dst, false, s.tokenError(i, field, len(dst))
			}
			dst = append(dst, uint32(v))
		} else if i < len(b) && b[i] == '0' {
			i++
			if i < len(b) && (b[i] >= '0' && b[i] <= '9' || b[i] == '.' || b[i] == 'e' || b[i] == 'E') {
				return dst, false, s.tokenError(i-1, field, len(dst))
			}
			dst = append(dst, 0)
		} else {
			return dst, false, s.tokenError(i, field, len(dst))
		}
		for i < len(b) && isSpace(b[i]) {
			i++
		}
		if i < len(b) && b[i] == ',' {
			i++
			continue
		}
		if i < len(b) && b[i] == ']' {
			s.i = i + 1
			return dst, false, nil
		}
		s.i = i
		if i >= len(b) {
			return dst, false, s.syntax("EOF while parsing a list")
		}
		return dst, false, s.syntax("expected `,` or `]`")
	}
}

// digitRun returns how many of the eight bytes of x (first byte lowest)
// are ASCII digits before the first non-digit; 8 when all are.
func digitRun(x uint64) int {
	const lo, hi = 0x0F0F0F0F0F0F0F0F, 0xF0F0F0F0F0F0F0F0
	// A byte is a digit when its high nibble is 3 and its low nibble is
	// below 10; t is non-zero exactly in the bytes that are not digits.
	t := (x&hi ^ 0x3030303030303030) | ((x&lo + 0x0606060606060606) & hi)
	m := ((t&0x7F7F7F7F7F7F7F7F + 0x7F7F7F7F7F7F7F7F) | t) & 0x8080808080808080
	return bits.TrailingZeros64(m) >> 3
}

// parseDigits converts the first n (1..8) ASCII digits of x to their value
// with three multiplications instead of n.
func parseDigits(x uint64, n int) uint64 {
	x <<= 8 * (8 - n) // the digits to the top bytes; zero bytes read as leading zeros
	x = (x & 0x0F0F0F0F0F0F0F0F) * 2561 >> 8
	x = (x & 0x00FF00FF00FF00FF) * 6553601 >> 16
	return (x & 0x0000FFFF0000FFFF) * 42949672960001 >> 32
}

// tokenError explains why the element of index idx near offset at is not a
// token id: a syntax error (400) when the JSON itself is broken, else a
// shape error (422) naming the field and index. It re-reads the element from
// its start, so it is only ever on the error path.
func (s *scanner) tokenError(at int, field string, idx int) error {
	start := at
	for start > 0 && !(s.b[start-1] == ',' || s.b[start-1] == '[' || isSpace(s.b[start-1])) {
		start--
	}
	s.i = start
	if s.i >= len(s.b) {
		return s.syntax("EOF while parsing a list")
	}
	c := s.b[s.i]
	if c == ']' || c == ',' {
		return s.syntax("expected value")
	}
	if err := s.skipValue(1); err != nil {
		return err
	}
	if s.i < len(s.b) && !(isSpace(s.b[s.i]) || s.b[s.i] == ',' || s.b[s.i] == ']') {
		return s.syntax("expected `,` or `]`") // "01", "1x": broken JSON, not a bad token
	}
	elem := s.b[start:s.i]
	s.i = start
	what := "invalid type: " + kindOf(c)
	switch {
	case c == '-' || c >= '0' && c <= '9':
		if bytes.ContainsAny(elem, ".eE") {
			what = "invalid type: floating point `" + string(elem) + "`"
		} else {
			what = "invalid value: integer `" + string(elem) + "`"
		}
	case c == '"' || c == '[' || c == '{':
		// kindOf says enough; echoing a string could echo a prompt.
	default:
		what = "invalid type: " + string(elem)
	}
	return s.shape(fmt.Sprintf("%s[%d]: %s, expected u32", field, idx, what))
}

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

// TokenList is a []uint32 that decodes with the strict token decoder; it is
// used for token arrays nested below the top level (routing_token_ids).
type TokenList []uint32

// UnmarshalJSON implements json.Unmarshaler.
func (t *TokenList) UnmarshalJSON(b []byte) error {
	s := scanner{b: b}
	s.ws()
	v, null, err := s.tokenArray((*t)[:0], "routing_token_ids")
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			return &fieldError{msg: e.Msg[len(shapePrefix):]}
		}
		return err
	}
	if null {
		*t = nil
		return nil
	}
	*t = v
	return nil
}

// Hashes is a list of 64-bit hashes. On input each may be written as a signed
// (i64) or unsigned (u64) integer; both are read as the same bit pattern. On
// output they are written as i64, as Dynamo does.
type Hashes []uint64

// UnmarshalJSON implements json.Unmarshaler.
func (h *Hashes) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*h = nil
		return nil
	}
	if len(b) < 2 || b[0] != '[' {
		return &fieldError{msg: "invalid type: expected a sequence of integers"}
	}
	out := (*h)[:0]
	if out == nil {
		out = make([]uint64, 0, len(b)/8+1)
	}
	s := scanner{b: b, i: 1}
	s.ws()
	if s.i < len(b) && b[s.i] == ']' {
		*h = out
		return nil
	}
	for idx := 0; ; idx++ {
		s.ws()
		start := s.i
		if s.i >= len(b) || !(b[s.i] == '-' || b[s.i] >= '0' && b[s.i] <= '9') {
			return &fieldError{msg: fmt.Sprintf("[%d]: invalid type: expected an integer hash", idx)}
		}
		if _, err := s.number(); err != nil {
			return err
		}
		v, err := parseHash(b[start:s.i])
		if err != nil {
			return &fieldError{msg: fmt.Sprintf("[%d]: %v", idx, err)}
		}
		out = append(out, v)
		s.ws()
		if s.i < len(b) && b[s.i] == ',' {
			s.i++
			continue
		}
		break
	}
	*h = out
	return nil
}

// parseHash reads an integer in [-2^63, 2^64-1] as a u64 bit pattern.
func parseHash(b []byte) (uint64, error) {
	if len(b) > 0 && b[0] == '-' {
		v, err := strconv.ParseInt(string(b), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("invalid value: `%s`, expected i64 or u64", b)
		}
		return uint64(v), nil
	}
	v, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid value: `%s`, expected i64 or u64", b)
	}
	return v, nil
}

// MarshalJSON implements json.Marshaler, writing each hash as an i64.
func (h Hashes) MarshalJSON() ([]byte, error) {
	out := make([]byte, 0, 2+len(h)*21)
	out = append(out, '[')
	for i, v := range h {
		if i > 0 {
			out = append(out, ',')
		}
		out = strconv.AppendInt(out, int64(v), 10)
	}
	return append(out, ']'), nil
}

// RawJSON keeps a JSON value's bytes for later decoding (an OpenAI
// prompt that may be text or tokens). DecodeJSON's decoder hands custom
// unmarshalers a copy, so the bytes are kept as they are.
type RawJSON []byte

// UnmarshalJSON implements json.Unmarshaler.
func (r *RawJSON) UnmarshalJSON(b []byte) error {
	*r = b
	return nil
}

func (r RawJSON) first() byte {
	for _, c := range r {
		if !isSpace(c) {
			return c
		}
	}
	return 0
}

// IsArray reports whether the value is a JSON array.
func (r RawJSON) IsArray() bool { return r.first() == '[' }

// IsString reports whether the value is a JSON string.
func (r RawJSON) IsString() bool { return r.first() == '"' }

// UnmarshalPlain decodes a JSON document that carries no prompt into v,
// with the same error statuses as DecodeJSON.
func UnmarshalPlain(body []byte, v any) error { return goccyDecode(body, v) }
