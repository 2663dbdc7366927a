package indexer

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// Field readers shared by both encodings (docs/kv-events.md §4). Each
// reads one value.

func (d *Decoder) readHashes(r *reader, ev *Event) error {
	if r.isNil() {
		return nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if len(d.hashes)+n > maxHashesPerPayload {
		return fmt.Errorf("more than %d block hashes", maxHashesPerPayload)
	}
	start := len(d.hashes)
	d.hashes = slices.Grow(d.hashes, n)
	// Fast path: full-width integers (random 64-bit hashes nearly always
	// are), read with a local index; anything else is left to r.hash.
	b, i := r.b, r.i
	for k := 0; k < n && i+9 <= len(b) && (b[i] == 0xcf || b[i] == 0xd3); k++ {
		d.hashes = append(d.hashes, binary.BigEndian.Uint64(b[i+1:i+9]))
		i += 9
	}
	r.i = i
	for range n - (len(d.hashes) - start) {
		h, err := r.hash()
		if err != nil {
			return err
		}
		d.hashes = append(d.hashes, h)
	}
	ev.BlockHashes = d.hashes[start:len(d.hashes):len(d.hashes)]
	return nil
}

func (d *Decoder) readParent(r *reader, ev *Event) (err error) {
	if r.isNil() {
		return nil
	}
	ev.ParentHash, err = r.hash()
	ev.HasParent = err == nil
	return err
}

// readTokens reads token ids; bigram pairs [[a,b],[b,c],…] (vLLM's Eagle
// form, docs/kv-events.md §7) become a, b, c, … and mark the event as Eagle.
func (d *Decoder) readTokens(r *reader, ev *Event) error {
	if r.isNil() {
		return nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	start := len(d.tokens)
	d.tokens = slices.Grow(d.tokens, n)
	b := r.b
	k, i := readIDs(d.tokens[start:start+n], b, r.i)
	r.i = i
	d.tokens = d.tokens[:start+k]
	for ; k < n; k++ {
		if i := r.i; i < len(b) {
			switch c := b[i]; {
			case c <= 0x7f:
				d.tokens = append(d.tokens, uint32(c))
				r.i++
				continue
			case c == 0xcd && i+3 <= len(b):
				d.tokens = append(d.tokens, uint32(binary.BigEndian.Uint16(b[i+1:i+3])))
				r.i += 3
				continue
			case c == 0xce && i+5 <= len(b):
				d.tokens = append(d.tokens, binary.BigEndian.Uint32(b[i+1:i+5]))
				r.i += 5
				continue
			case c == 0xcc && i+2 <= len(b):
				d.tokens = append(d.tokens, uint32(b[i+1]))
				r.i += 2
				continue
			}
		}
		c, err := r.peek()
		if err != nil {
			return err
		}
		if isArray(c) {
			m, err := r.arrayLen()
			if err != nil || m != 2 {
				return fmt.Errorf("token bigram %d of %d elements: %v", k, m, err)
			}
			a, err := tokenValue(r)
			if err != nil {
				return err
			}
			b, err := tokenValue(r)
			if err != nil {
				return err
			}
			if k == 0 {
				d.tokens = append(d.tokens, a)
			}
			d.tokens = append(d.tokens, b)
			ev.Eagle = true
			continue
		}
		t, err := tokenValue(r)
		if err != nil {
			return err
		}
		d.tokens = append(d.tokens, t)
	}
	ev.TokenIDs = d.tokens[start:len(d.tokens):len(d.tokens)]
	return nil
}

// readIDs is readTokens' fast path: it reads ids into out from b at i
// while they come in the unsigned encodings msgpack writers use for token
// ids, and returns how many it read and where it stopped; anything else
// (bigram pairs, signed encodings, the last bytes of b, errors) it leaves
// for the careful loop.
//
// Where an id starts depends on the width of the one before, so the loop
// is a chain of loads, each waiting for the last. It takes the common
// case, two ids of 16 or 32 bits (0xcd, 0xce), a pair at a time: the
// second id's header is at 3 or 5 bytes, both inside one 8-byte load, so
// a pair costs one load on the chain instead of two. The choice between
// them is arithmetic, not a branch: which width comes next is a coin toss
// (ids straddle the 16-bit boundary) that a branch predictor keeps losing.
//
// Runs of such ids go four at a time first (readIDQuads); the pair and
// single steps below take what a quad cannot (another encoding, the run's
// last ids), and the quads resume after each of them.
func readIDs(out []uint32, b []byte, i int) (k, next int) {
	n := len(out)
	for k < n && i+10 <= len(b) {
		if k, i = readIDQuads(out, b, k, i); k >= n || i+10 > len(b) {
			break
		}
		w := binary.LittleEndian.Uint64(b[i : i+8])
		// 0xcd (3 bytes) is odd, 0xce (5) even: the low bits of the first
		// header and of both places the second may be at pick the widths,
		// by masks rather than shifts so the chain to the next i is short.
		odd1 := uint(w) & 1
		at3, at5 := uint(w>>24)&1, uint(w>>40)&1
		odd2 := at5 ^ (at3^at5)&-odd1
		j := i + 5 - 2*int(odd1) // the second id's header
		if k+2 <= n && byte(w)-0xcd < 2 && b[j]-0xcd < 2 {
			out[k] = binary.BigEndian.Uint32(b[i+1:i+5]) >> (16 * odd1)
			out[k+1] = binary.BigEndian.Uint32(b[j+1:j+5]) >> (16 * odd2)
			i += 10 - 2*int(odd1+odd2)
			k += 2
			continue
		}
		c := tokenCodes[byte(w)]
		if c.size == 0 {
			break
		}
		// One table load and a shift instead of a branch per encoding.
		out[k] = (binary.BigEndian.Uint32(b[i+1:i+5])>>c.shift)&c.mask | c.fix
		i += int(c.size)
		k++
	}
	return k, i
}

// readIDQuads is readIDs' fastest loop, from id k at byte i: four ids of 16 or 32 bits at a
// time, from two 8-byte loads at the first one's header. Which of the
// places each later header may be at holds it follows from the low bits
// (0xcd odd, 3 bytes; 0xce even, 5) of the headers before it, so the
// chain from one quad's start to the next is the two loads and a few
// masks and shifts: the second header is at 3 or 5 bytes, the third at 6,
// 8 or 10, the fourth at 9 to 15, the next quad at 12 to 20. It stops at
// the first quad with another encoding, fewer than four ids left, or
// fewer than 20 bytes. Where the processor has AVX-512 VBMI, kernels
// take the same quads first, 64 bytes of b at a time (readIDQuadsVector),
// and the loop below only finds that it stops where they did.
func readIDQuads(out []uint32, b []byte, k, i int) (int, int) {
	k, i = readIDQuadsVector(out, b, k, i)
	for k+4 <= len(out) && i+20 <= len(b) {
		p := b[i : i+20 : i+20]
		w0 := binary.LittleEndian.Uint64(p[0:8])
		w1 := binary.LittleEndian.Uint64(p[8:16])
		o1 := uint(w0) & 1 // 1: the first id is 16 bits (0xcd)
		at3, at5 := uint(w0>>24)&1, uint(w0>>40)&1
		o2 := at5 ^ (at3^at5)&-o1
		s2 := o1 + o2 // the third header is at 10 - 2·s2
		o3 := (uint(w1>>16)&1 | uint(w1)&1<<1 | uint(w0>>46)&4) >> (s2 & 3) & 1
		s3 := s2 + o3 // the fourth header is at 15 - 2·s3
		o4 := (uint(w1>>56)&1 | uint(w1>>39)&2 | uint(w1>>22)&4 | uint(w1>>5)&8) >> (s3 & 3) & 1
		h2, h3, h4 := (5-2*o1)&7, (10-2*s2)&15, (15-2*s3)&15
		if (byte(w0)-0xcd)|(p[h2]-0xcd)|(p[h3]-0xcd)|(p[h4]-0xcd) >= 2 {
			break // another encoding among them: the loops below read it
		}
		o := out[k : k+4 : k+4]
		o[0] = binary.BigEndian.Uint32(p[1:5]) >> (16 * o1)
		o[1] = binary.BigEndian.Uint32(p[h2+1:h2+5]) >> (16 * o2)
		o[2] = binary.BigEndian.Uint32(p[h3+1:h3+5]) >> (16 * o3)
		o[3] = binary.BigEndian.Uint32(p[h4+1:h4+5]) >> (16 * o4)
		i += 20 - 2*int(s3+o4)
		k += 4
	}
	return k, i
}

func tokenValue(r *reader) (uint32, error) {
	v, err := r.int64v()
	if err != nil {
		return 0, err
	}
	if v < 0 || v > 0xFFFFFFFF {
		return 0, fmt.Errorf("token id %d out of range", v)
	}
	return uint32(v), nil
}

func readOptInt(r *reader) (int64, bool, error) {
	if r.isNil() {
		return 0, false, nil
	}
	v, err := r.int64v()
	return v, err == nil, err
}

func readOptStr(r *reader) ([]byte, error) {
	if r.isNil() {
		return nil, nil
	}
	return r.str()
}

// readBlockSize reads a store's block_size: nil or 0 means the
// partition's; a negative one (2^63 sent unsigned reads as one) is
// malformed, where it used to be taken for the partition's as well.
func readBlockSize(r *reader, ev *Event) error {
	bs, _, err := readOptInt(r)
	if err == nil && bs < 0 {
		err = fmt.Errorf("block_size %d", bs)
	}
	ev.BlockSize = int(bs)
	return err
}

// readLora reads lora_name: a string, nil, or SGLang's {cache_salt: …} map
// (docs/kv-events.md §7).
func readLora(r *reader, ev *Event) error {
	c, err := r.peek()
	if err != nil {
		return err
	}
	if isMap(c) {
		return readSaltMap(r, ev)
	}
	s, err := readOptStr(r)
	ev.LoraName = string(s)
	return err
}

// readSaltMap reads a {cache_salt: …} map, ignoring its other keys.
func readSaltMap(r *reader, ev *Event) error {
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	for range n {
		k, err := r.str()
		if err != nil {
			return err
		}
		if string(k) == "cache_salt" {
			s, err := readOptStr(r)
			if err != nil {
				return err
			}
			ev.CacheSalt = string(s)
			continue
		}
		if err := r.skip(0); err != nil {
			return err
		}
	}
	return nil
}

// readMedium reads medium into the event's tier; an unknown medium marks
// the event to skip (docs/kv-events.md §5).
func readMedium(r *reader, ev *Event) error {
	m, err := readOptStr(r)
	if err != nil {
		return err
	}
	t, ok := tierOf(m)
	ev.Tier = t
	if !ok {
		ev.Skip = true
	}
	return nil
}

// readGroup reads group_idx; which group of a rank is indexed is the
// rank's (groups.go).
func readGroup(r *reader, ev *Event) error {
	g, ok, err := readOptInt(r)
	ev.Group, ev.HasGroup = g, ok
	return err
}

// readSpecKind applies kv_cache_spec_kind: only full-attention groups are
// indexed (and of those, one a rank: groups.go).
func readSpecKind(r *reader, ev *Event) error {
	k, err := readOptStr(r)
	switch string(k) {
	case "":
	case "full_attention", "mla_attention", "sink_full_attention":
		ev.FullKind = true
	default:
		ev.Skip = true
	}
	return err
}

// readLocality applies locality: only local blocks are indexed.
func readLocality(r *reader, ev *Event) error {
	l, err := readOptStr(r)
	switch string(l) {
	case "", "LOCAL", "local":
	default:
		ev.Skip = true
	}
	return err
}

// tokenCode says how the fast path reads a token id starting with a given
// msgpack byte: size bytes in all (0: not an unsigned integer the fast path
// reads), the id being (the 4 bytes after the first, big-endian) >> shift
// & mask, or'd with fix (the byte itself for a positive fixint).
type tokenCode struct {
	mask, fix   uint32
	shift, size uint8
}

// tokenCodes is tokenCode by first byte.
var tokenCodes = func() (t [256]tokenCode) {
	for c := range 0x80 {
		t[c] = tokenCode{fix: uint32(c), size: 1}
	}
	t[0xcc] = tokenCode{mask: 0xff, shift: 24, size: 2}
	t[0xcd] = tokenCode{mask: 0xffff, shift: 16, size: 3}
	t[0xce] = tokenCode{mask: 0xffffffff, size: 5}
	return t
}()
