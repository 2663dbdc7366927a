package cluster

import "errors"

// checkShape walks one msgpack value, the whole of data, before the
// msgpack library decodes it, and refuses a message whose arrays, maps,
// strings or binaries claim more than it can hold: more elements than
// maxElems, or more than the bytes left (every element takes one byte at
// least). The library sizes a slice by its header's count before reading
// an element, so a 47-byte message claiming 2^32 events asked for 721 GB
// and killed the process; a 256 KiB one of 262,000 empty events made 88 MB
// of them before their count was checked. The walk allocates nothing and
// holds no stack: nested values are counted, not recursed into.
func checkShape(data []byte, maxElems int) error {
	pos, pending := 0, uint64(1) // values still to walk
	// take reads an n-byte big-endian length at pos.
	take := func(n int) (uint64, error) {
		if n > len(data)-pos {
			return 0, errShape
		}
		var v uint64
		for _, b := range data[pos : pos+n] {
			v = v<<8 | uint64(b)
		}
		pos += n
		return v, nil
	}
	for ; pending > 0; pending-- {
		if pos >= len(data) {
			return errShape
		}
		c := data[pos]
		pos++
		var skip, elems uint64 // bytes of this value's own; values inside it
		pairs := false         // elems counts a map's keys and values
		var err error
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3: // fixints, nil, bools
		case c <= 0x8f: // fixmap
			elems, pairs = uint64(c&0x0f), true
		case c <= 0x9f: // fixarray
			elems = uint64(c & 0x0f)
		case c <= 0xbf: // fixstr
			skip = uint64(c & 0x1f)
		case c == 0xc4 || c == 0xd9: // bin8, str8
			skip, err = take(1)
		case c == 0xc5 || c == 0xda: // bin16, str16
			skip, err = take(2)
		case c == 0xc6 || c == 0xdb: // bin32, str32
			skip, err = take(4)
		case c >= 0xc7 && c <= 0xc9: // ext8, ext16, ext32: length, then a type byte
			skip, err = take(1 << (c - 0xc7))
			skip++
		case c == 0xca: // float32
			skip = 4
		case c == 0xcb: // float64
			skip = 8
		case c >= 0xcc && c <= 0xcf: // uint8..uint64
			skip = 1 << (c - 0xcc)
		case c >= 0xd0 && c <= 0xd3: // int8..int64
			skip = 1 << (c - 0xd0)
		case c >= 0xd4 && c <= 0xd8: // fixext1..fixext16: a type byte, then the data
			skip = 1 + 1<<(c-0xd4)
		case c == 0xdc: // array16
			elems, err = take(2)
		case c == 0xdd: // array32
			elems, err = take(4)
		case c == 0xde: // map16
			elems, err = take(2)
			pairs = true
		case c == 0xdf: // map32
			elems, err = take(4)
			pairs = true
		default: // 0xc1, never used
			return errShape
		}
		if err != nil {
			return err
		}
		if elems > uint64(maxElems) {
			return errShape
		}
		if pairs {
			elems *= 2
		}
		if skip+elems > uint64(len(data)-pos) {
			return errShape
		}
		pos += int(skip)
		pending += elems
	}
	if pos != len(data) {
		return errShape
	}
	return nil
}

var errShape = errors.New("cluster message: a length past the message or its bounds")
