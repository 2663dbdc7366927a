package selection

import (
	"bytes"
	"fmt"
	"math/bits"
	"unsafe"
)

// The token-array fast path: a prompt's token_ids can be 100,000 elements,
// so they are parsed in one pass, eight bytes at a time where the bytes
// allow, straight into a reused []uint32. Everything slow (spaces, long
// numbers, errors) falls through to a byte-at-a-time loop.

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
	// Size the slice once: every element but the last is followed by a
	// comma, so the array's commas, plus one, bound the count and
	// append never reallocates per token. Counting them (vectorised) costs
	// far less than allocating and zeroing the cruder bound of one element
	// per two bytes, three times the usual need. A new slice is sized now;
	// a reused one (a pooled request's) is filled as it is, and sized only
	// if it runs short, so the usual reuse for a prompt of about the same
	// length never counts the body's commas at all.
	var scratch tokenScratch
	sized := false
	if cap(dst) == 0 {
		dst, sized = withRoomFor(dst, b[i:]), true
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
		// it is written by index and its length set once. tokenRun takes
		// runs of such elements, 64 bytes of separators at a time.
		k, out := len(dst), dst[:cap(dst)]
		i, k = tokenRun(b, i, out, k, &scratch)
		// What tokenRun leaves (the body's last 64 bytes, the element after
		// its span or one it would not take) goes on here one element at a
		// time, for a few elements, then back to tokenRun.
		base, last, stop := unsafe.Pointer(unsafe.SliceData(b)), len(b)-8, min(len(out), k+swarRun)
		for littleEndian && i <= last && k < stop {
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
		if !sized && cap(dst)-len(dst) < tokenRunRoom {
			// A reused slice running short is sized, once: afterwards it
			// has room for every element left, and the append below and
			// the runs after it never reallocate.
			dst, sized = withRoomFor(dst, b[i:]), true
		}
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

// swarRun is how many elements tokenArray's eight-byte loop parses before
// it hands back to tokenRun, which is faster on long runs.
const swarRun = 16

// comma is what tokenArray counts to size a new slice.
var comma = []byte{','}

// withRoomFor returns dst (its elements kept) with room for as many more
// elements as the array in rest could hold: the commas before its first
// ']' (which no token element holds, so the array ends there at the
// latest), plus one. It reallocates only when dst has less room than that.
func withRoomFor(dst []uint32, rest []byte) []uint32 {
	if end := bytes.IndexByte(rest, ']'); end >= 0 {
		rest = rest[:end]
	}
	n := bytes.Count(rest, comma) + 1
	if cap(dst)-len(dst) >= n {
		return dst
	}
	grown := make([]uint32, len(dst), len(dst)+n)
	copy(grown, dst)
	return grown
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
