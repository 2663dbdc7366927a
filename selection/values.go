package selection

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Value types with their own JSON forms, decoded by the strict decoders of
// this package rather than goccy's defaults.

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

// IsSet reports whether the member was sent with a value other than null.
func (r RawJSON) IsSet() bool {
	v := bytes.TrimSpace(r)
	return len(v) > 0 && !bytes.Equal(v, []byte("null"))
}

// IsTrue reports whether the value is the literal true.
func (r RawJSON) IsTrue() bool { return bytes.Equal(bytes.TrimSpace(r), []byte("true")) }

// Text is the value of a JSON string, its escapes decoded ("\u0072ight"
// is "right", as the engine reads it); ok is false for any other value.
func (r RawJSON) Text() (s string, ok bool) {
	v := bytes.TrimSpace(r)
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	if bytes.IndexByte(v, '\\') < 0 {
		return string(v[1 : len(v)-1]), true
	}
	return s, json.Unmarshal(v, &s) == nil
}
