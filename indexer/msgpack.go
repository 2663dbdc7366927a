package indexer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// A small msgpack reader: just what KV-event payloads need, over a byte
// slice, with every length checked against the bytes that remain (a payload
// that claims a 4 GiB array fails at once instead of allocating).

var errTruncated = errors.New("msgpack: truncated")

type reader struct {
	b []byte
	i int
}

func (r *reader) byte1() (byte, error) {
	if r.i >= len(r.b) {
		return 0, errTruncated
	}
	c := r.b[r.i]
	r.i++
	return c, nil
}

func (r *reader) take(n int) ([]byte, error) {
	if n < 0 || n > len(r.b)-r.i {
		return nil, errTruncated
	}
	s := r.b[r.i : r.i+n]
	r.i += n
	return s, nil
}

func (r *reader) peek() (byte, error) {
	if r.i >= len(r.b) {
		return 0, errTruncated
	}
	return r.b[r.i], nil
}

func (r *reader) uintN(n int) (uint64, error) {
	s, err := r.take(n)
	if err != nil {
		return 0, err
	}
	switch n {
	case 1:
		return uint64(s[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(s)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(s)), nil
	}
	return binary.BigEndian.Uint64(s), nil
}

// isNil consumes a nil if one is next.
func (r *reader) isNil() bool {
	if r.i < len(r.b) && r.b[r.i] == 0xc0 {
		r.i++
		return true
	}
	return false
}

// arrayLen reads an array header. Each element takes at least one byte, so
// a count larger than what remains is rejected before anyone allocates.
func (r *reader) arrayLen() (int, error) {
	c, err := r.byte1()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c&0xf0 == 0x90:
		n = uint64(c & 0x0f)
	case c == 0xdc:
		n, err = r.uintN(2)
	case c == 0xdd:
		n, err = r.uintN(4)
	default:
		return 0, fmt.Errorf("msgpack: expected array, got 0x%02x", c)
	}
	if err != nil {
		return 0, err
	}
	if n > uint64(len(r.b)-r.i) {
		return 0, fmt.Errorf("msgpack: array of %d elements in %d bytes", n, len(r.b)-r.i)
	}
	return int(n), nil
}

// mapLen reads a map header, checked like arrayLen (two bytes per entry).
func (r *reader) mapLen() (int, error) {
	c, err := r.byte1()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c&0xf0 == 0x80:
		n = uint64(c & 0x0f)
	case c == 0xde:
		n, err = r.uintN(2)
	case c == 0xdf:
		n, err = r.uintN(4)
	default:
		return 0, fmt.Errorf("msgpack: expected map, got 0x%02x", c)
	}
	if err != nil {
		return 0, err
	}
	if n > uint64(len(r.b)-r.i)/2 {
		return 0, fmt.Errorf("msgpack: map of %d entries in %d bytes", n, len(r.b)-r.i)
	}
	return int(n), nil
}

func isArray(c byte) bool { return c&0xf0 == 0x90 || c == 0xdc || c == 0xdd }
func isMap(c byte) bool   { return c&0xf0 == 0x80 || c == 0xde || c == 0xdf }

// str reads a string (or bin) and returns its bytes, aliasing the payload.
func (r *reader) str() ([]byte, error) {
	c, err := r.byte1()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c&0xe0 == 0xa0:
		n = uint64(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		n, err = r.uintN(1)
	case c == 0xda || c == 0xc5:
		n, err = r.uintN(2)
	case c == 0xdb || c == 0xc6:
		n, err = r.uintN(4)
	default:
		return nil, fmt.Errorf("msgpack: expected string, got 0x%02x", c)
	}
	if err != nil {
		return nil, err
	}
	return r.take(int(min(n, math.MaxInt32)))
}

// int64v reads any integer as an int64 bit pattern (uint64 values above
// 2^63-1 wrap, which is what hashes want).
func (r *reader) int64v() (int64, error) {
	c, err := r.byte1()
	if err != nil {
		return 0, err
	}
	switch {
	case c <= 0x7f:
		return int64(c), nil
	case c >= 0xe0:
		return int64(int8(c)), nil
	case c == 0xcc:
		v, err := r.uintN(1)
		return int64(v), err
	case c == 0xcd:
		v, err := r.uintN(2)
		return int64(v), err
	case c == 0xce:
		v, err := r.uintN(4)
		return int64(v), err
	case c == 0xcf:
		v, err := r.uintN(8)
		return int64(v), err
	case c == 0xd0:
		v, err := r.uintN(1)
		return int64(int8(v)), err
	case c == 0xd1:
		v, err := r.uintN(2)
		return int64(int16(v)), err
	case c == 0xd2:
		v, err := r.uintN(4)
		return int64(int32(v)), err
	case c == 0xd3:
		v, err := r.uintN(8)
		return int64(v), err
	}
	return 0, fmt.Errorf("msgpack: expected integer, got 0x%02x", c)
}

// hash reads an engine block hash: an integer (signed or unsigned, same
// bits) or bytes, of which the last eight are read big-endian (vLLM's
// maybe_convert_block_hash keeps the low 64 bits).
func (r *reader) hash() (uint64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	// Random 64-bit hashes are nearly always a full uint64 or int64.
	if (c == 0xcf || c == 0xd3) && len(r.b)-r.i >= 9 {
		v := binary.BigEndian.Uint64(r.b[r.i+1 : r.i+9])
		r.i += 9
		return v, nil
	}
	if c >= 0xc4 && c <= 0xc6 {
		b, err := r.str()
		if err != nil {
			return 0, err
		}
		if len(b) == 0 {
			return 0, errors.New("msgpack: empty block hash")
		}
		var v uint64
		for _, x := range b[max(0, len(b)-8):] {
			v = v<<8 | uint64(x)
		}
		return v, nil
	}
	v, err := r.int64v()
	return uint64(v), err
}

// float reads a float or integer as float64 (timestamps).
func (r *reader) float() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xca:
		r.i++
		v, err := r.uintN(4)
		return float64(math.Float32frombits(uint32(v))), err
	case 0xcb:
		r.i++
		v, err := r.uintN(8)
		return math.Float64frombits(v), err
	}
	v, err := r.int64v()
	return float64(v), err
}

// skip moves past one value of any type.
func (r *reader) skip(depth int) error {
	if depth > 64 {
		return errors.New("msgpack: nesting too deep")
	}
	c, err := r.byte1()
	if err != nil {
		return err
	}
	var n uint64
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		return nil
	case c&0xf0 == 0x80 || c&0xf0 == 0x90 || c == 0xdc || c == 0xdd || c == 0xde || c == 0xdf:
		r.i--
		var count int
		if isMap(c) {
			m, err := r.mapLen()
			if err != nil {
				return err
			}
			count = 2 * m
		} else {
			if count, err = r.arrayLen(); err != nil {
				return err
			}
		}
		for range count {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case c&0xe0 == 0xa0:
		_, err = r.take(int(c & 0x1f))
		return err
	case c == 0xc4 || c == 0xd9:
		n, err = r.uintN(1)
	case c == 0xc5 || c == 0xda:
		n, err = r.uintN(2)
	case c == 0xc6 || c == 0xdb:
		n, err = r.uintN(4)
	case c == 0xcc || c == 0xd0:
		n = 1
	case c == 0xcd || c == 0xd1:
		n = 2
	case c == 0xce || c == 0xd2 || c == 0xca:
		n = 4
	case c == 0xcf || c == 0xd3 || c == 0xcb:
		n = 8
	case c >= 0xd4 && c <= 0xd8: // fixext: type byte + 1..16 bytes
		n = 1 + 1<<(c-0xd4)
	case c == 0xc7 || c == 0xc8 || c == 0xc9: // ext 8/16/32: length, type, data
		size := map[byte]int{0xc7: 1, 0xc8: 2, 0xc9: 4}[c]
		if n, err = r.uintN(size); err == nil {
			n++
		}
	default:
		return fmt.Errorf("msgpack: invalid byte 0x%02x", c)
	}
	if err != nil {
		return err
	}
	_, err = r.take(int(min(n, math.MaxInt32)))
	return err
}
