package selection

import (
	"math/bits"
	"unsafe"
)

// The token-array fast path's inner loop, driven by separator masks.
//
// Parsing one element at a time makes each element's address depend on the
// digits of the one before it (find the comma, then load the next eight
// bytes): a chain of ~15 dependent cycles per token that no amount of
// superscalar width can shorten. Here the commas of 64 bytes at a time are
// found first, as one 64-bit mask (tokenmask.go), and the elements between
// them are then parsed independently of each other: only "clear the lowest
// set bit" links one element to the next.

// tokenRunRoom is the room in out that lets tokenRun take a block without
// checking it per element: at most 32 elements end in 64 bytes.
const tokenRunRoom = 32

// runSpan is how many bytes one tokenRun call reads at most: about 2,500
// token ids, a few microseconds.
const runSpan = 16 << 10

// wordMasks returns the comma bits and the space bits of the eight bytes
// of x (first byte lowest: bit j set when byte j is ',', or ' ') and a
// word that is zero exactly when every byte is an ASCII digit, a comma or
// a space. It is small enough to be inlined, so a block's eight calls
// share registers and constants.
func wordMasks(x uint64) (commas, spaces, odd uint64) {
	const lo, hi = 0x0F0F0F0F0F0F0F0F, 0xF0F0F0F0F0F0F0F0
	c := x ^ 0x2C2C2C2C2C2C2C2C // ',' bytes become zero
	s := x ^ 0x2020202020202020 // ' ' bytes become zero
	// Exactly the zero bytes get their high bit set (no borrow from a
	// neighbour, unlike the shorter has-zero trick).
	cm := ^((c&0x7F7F7F7F7F7F7F7F + 0x7F7F7F7F7F7F7F7F) | c) & 0x8080808080808080
	sm := ^((s&0x7F7F7F7F7F7F7F7F + 0x7F7F7F7F7F7F7F7F) | s) & 0x8080808080808080
	// t is zero exactly in the digit bytes (as in digitRun), and exactly
	// 0x10 in a comma byte (0x2C: high nibble 2, low nibble 12) and in a
	// space (0x20), which their high bits moved to bit 4 clear.
	t := (x&hi ^ 0x3030303030303030) | ((x&lo + 0x0606060606060606) & hi)
	// The high bits are gathered into the top byte: the partial products
	// land on distinct bits, so nothing carries into it.
	const gather = 0x0102040810204080
	return (cm >> 7) * gather >> 56, (sm >> 7) * gather >> 56, t &^ ((cm | sm) >> 3)
}

// blockMask returns the comma and space masks of the 64 bytes at p (bit j
// set when byte j is ',', or ' ') and whether they are all digits,
// commas, and spaces that directly follow a comma (", ", as Python's
// json.dumps writes arrays); carry is 1 when the byte before p is a comma.
func blockMask(p unsafe.Pointer, carry uint64) (uint64, uint64, bool) {
	m0, s0, o0 := wordMasks(*(*uint64)(p))
	m1, s1, o1 := wordMasks(*(*uint64)(unsafe.Add(p, 8)))
	m2, s2, o2 := wordMasks(*(*uint64)(unsafe.Add(p, 16)))
	m3, s3, o3 := wordMasks(*(*uint64)(unsafe.Add(p, 24)))
	m4, s4, o4 := wordMasks(*(*uint64)(unsafe.Add(p, 32)))
	m5, s5, o5 := wordMasks(*(*uint64)(unsafe.Add(p, 40)))
	m6, s6, o6 := wordMasks(*(*uint64)(unsafe.Add(p, 48)))
	m7, s7, o7 := wordMasks(*(*uint64)(unsafe.Add(p, 56)))
	mask := m0 | m1<<8 | m2<<16 | m3<<24 | m4<<32 | m5<<40 | m6<<48 | m7<<56
	spaces := s0 | s1<<8 | s2<<16 | s3<<24 | s4<<32 | s5<<40 | s6<<48 | s7<<56
	return mask, spaces, o0|o1|o2|o3|o4|o5|o6|o7 == 0 && spaces&^(mask<<1|carry) == 0
}

// tokenScratch is tokenRun's working memory, which its caller keeps across
// calls: as a local of tokenRun its 4 KB would be zeroed on every call,
// and an array that goes through the byte-at-a-time loop (one with spaces)
// calls it once an element.
type tokenScratch struct {
	group [groupBlocks]uint64                // comma masks of clean blocks
	words [groupBlocks * tokenRunRoom]uint64 // their elements, digits in the top bytes
}

// collectCompact puts the elements that end in the clean blocks from c,
// whose comma masks are masks, from the one that begins at start, into
// words, their digits shifted to the top bytes (parseDigits's first step),
// and returns where the next element begins, how many it put and whether
// it took them all. The blocks hold only digits and commas; an element is
// checked for its length (one to eight digits) and a leading zero only,
// and one that fails stops it, with start at it. The caller guarantees
// eight readable bytes at every element's start (8 past the last block)
// and that words has room for 32 elements a block.
func collectCompact(base unsafe.Pointer, masks []uint64, c, start int, words *[groupBlocks * tokenRunRoom]uint64) (int, int, bool) {
	m := 0
	for _, mask := range masks {
		for mask != 0 {
			end := c + bits.TrailingZeros64(mask)
			mask &= mask - 1
			n := end - start
			if uint(n-1) > 7 { // an empty element, or one over eight digits
				return start, m, false
			}
			x := *(*uint64)(unsafe.Add(base, start))
			if byte(x) == '0' && n != 1 { // a leading zero
				return start, m, false
			}
			// m < len(words): at most 32 elements end in 64 bytes (the
			// mask only spares the bounds check).
			words[m&(len(words)-1)] = x << (uint(64-8*n) & 63)
			m++
			start = end + 1
		}
		c += 64
	}
	return start, m, true
}

// collectSpaced is collectCompact for blocks that also hold ", ": a space
// directly after a comma is skipped. It is a copy rather than a flag of
// collectCompact: the test of a flag in its loop costs a compact array a
// tenth of its parse.
func collectSpaced(base unsafe.Pointer, masks []uint64, c, start int, words *[groupBlocks * tokenRunRoom]uint64) (int, int, bool) {
	m := 0
	for _, mask := range masks {
		for mask != 0 {
			end := c + bits.TrailingZeros64(mask)
			mask &= mask - 1
			n := end - start
			if uint(n-1) > 7 { // an empty element, or one over eight digits
				return start, m, false
			}
			x := *(*uint64)(unsafe.Add(base, start))
			if byte(x) == '0' && n != 1 { // a leading zero
				return start, m, false
			}
			words[m&(len(words)-1)] = x << (uint(64-8*n) & 63)
			m++
			start = end + 1
			// Readable: start <= c+64, before the eight bytes past the
			// last block.
			if *(*byte)(unsafe.Add(base, start)) == ' ' {
				start++
			}
		}
		c += 64
	}
	return start, m, true
}

// tokenRun parses the elements of a token array from b[i:] into out[k:]
// while each one is a plain integer of one to eight digits (no sign, no
// leading zero, no space) followed directly by a comma, 64 bytes of
// separators at a time. It returns where it stopped: i at the start of the
// first element it did not take (the last one, one with spaces, a long
// number, an error, or the end of the room in out or of b), and k the
// number of elements in out. The caller's byte-at-a-time loop takes it
// from there. It needs little-endian loads; elsewhere it takes nothing.
//
// The comma masks of up to groupBlocks blocks of 64 bytes are found first
// (commaMasks: in AVX2 where there is one), for as long as the blocks hold
// only digits and commas (nearly every block of a compact array) and have
// room after them for the eight-byte loads and room in out for the 32
// elements each can end at most. Their elements are then parsed without
// checking their digits or bounds, only their length and a leading zero:
// each one's eight bytes are shifted so that its digits fill the top
// bytes, and all of them are converted at once (digitValues: four at a
// time in AVX2 where there is one).
// A block with any other byte, and the one after it (whose first element
// began in it), check every element.
//
// It reads at most runSpan bytes a call and is never inlined: its loops
// have no safe point where the garbage collector could preempt them, and a
// 600 KB array parsed in one go would hold up every collection (and have
// the runtime signal it again and again) for as long as the parse lasts.
// The call's own entry is the safe point.
//
//go:noinline
func tokenRun(b []byte, i int, out []uint32, k int, scratch *tokenScratch) (int, int) {
	if !littleEndian {
		return i, k
	}
	// Spaces after a comma (", "): the element starts after them. The
	// caller takes it from i all the same, spaces or not.
	for i < len(b) && b[i] == ' ' {
		i++
	}
	base := unsafe.Pointer(unsafe.SliceData(b))
	// An array written otherwise (a newline, or a space before a comma)
	// comes here once an element from the caller's byte loop: leave it at
	// once unless the first element is digits and a comma.
	if i+8 > len(b) {
		return i, k
	}
	if x := *(*uint64)(unsafe.Add(base, i)); byte(x>>(8*(digitRun(x)&7))) != ',' {
		return i, k
	}
	dst := unsafe.Pointer(unsafe.SliceData(out))
	start := i // the first byte of the element being looked for
	limit := min(len(b), i+runSpan)
	// prevClean: the bytes of the element being looked for that lie in
	// earlier blocks (at most seven, elements are at most eight bytes)
	// were checked to be digits (and a space before them, after a comma,
	// has been skipped).
	prevClean := true
	group, words := &scratch.group, &scratch.words
	for c := i; c+64 <= limit; {
		// The comma masks of the blocks from c that hold only digits,
		// commas and spaces after a comma (up to groupBlocks, with room
		// after them for the loads).
		var carry uint64 // a comma just before c
		if c > 0 && b[c-1] == ',' {
			carry = 1
		}
		g, spaced := 0, false
		if prevClean {
			nb := min(groupBlocks, (limit-c)/64, (len(b)-c-8)/64, (len(out)-k)/tokenRunRoom)
			if nb > 0 {
				g, spaced = commaMasks(unsafe.Add(base, c), group[:nb], carry)
			}
		}
		if g > 0 {
			// Where there is AVX-512 VBMI, the blocks it can take go
			// straight to values (collectValues). The elements of the
			// rest, checked for length and a leading zero, go to words
			// with their digits in the top bytes (collectElements: in BMI
			// assembly where there is BMI); then all are converted at
			// once (digitValues: in AVX2 where there is one). In bounds:
			// out has room for 32 elements a block.
			m, done, ok := 0, 0, true
			if !spaced {
				start, m, done = collectValues(base, group[:g], c, start, unsafe.Add(dst, 4*k))
				k += m
			}
			if done < g {
				if spaced {
					start, m, ok = collectSpaced(base, group[:g], c, start, words)
				} else {
					start, m, ok = collectElements(base, group[done:g], c+64*done, start, words)
				}
				digitValues(words[:m], unsafe.Add(dst, 4*k))
				k += m
			}
			if !ok {
				return start, k
			}
			c += 64 * g
			continue
		}
		// A block with other bytes, one after such a block, or one
		// without the room: every element is checked.
		var mask uint64
		mask, _, prevClean = blockMask(unsafe.Add(base, c), carry)
		for mask != 0 {
			end := c + bits.TrailingZeros64(mask)
			mask &= mask - 1
			n := end - start
			// The eight-byte load at start must stay inside b, which an
			// element shorter than eight bytes near its end would leave.
			if n < 1 || n > 8 || k >= len(out) || start+8 > len(b) {
				return start, k
			}
			x := *(*uint64)(unsafe.Add(base, start))
			// A leading zero is allowed only for the element "0".
			if byte(x)-'1' > 8 && (n != 1 || byte(x) != '0') {
				return start, k
			}
			if digitRun(x) != n { // a non-digit before the comma
				return start, k
			}
			out[k] = uint32(parseDigits(x, n))
			k++
			start = end + 1
			if start < len(b) && b[start] == ' ' { // ", "
				start++
			}
		}
		c += 64
	}
	return start, k
}
