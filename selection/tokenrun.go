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
// found first, as one 64-bit mask built from eight independent loads, and
// the elements between them are then parsed independently of each other:
// only "clear the lowest set bit" links one element to the next.

// runSpan is how many bytes one tokenRun call reads at most: about 2,500
// token ids, a few microseconds.
const runSpan = 16 << 10

// commaBits returns a byte mask of the bytes of x (first byte lowest) that
// are ',': bit j is set when byte j is.
func commaBits(x uint64) uint64 {
	t := x ^ 0x2C2C2C2C2C2C2C2C // ',' bytes become zero
	// Exactly the zero bytes get their high bit set (no borrow from a
	// neighbour, unlike the shorter has-zero trick).
	m := ^((t&0x7F7F7F7F7F7F7F7F + 0x7F7F7F7F7F7F7F7F) | t) & 0x8080808080808080
	// Gather the eight high bits into the top byte; the partial products
	// land on distinct bits, so nothing carries into it.
	return (m >> 7) * 0x0102040810204080 >> 56
}

// commaMask64 returns the comma mask of the 64 bytes at base+i: bit j is set
// when byte i+j is ','. The caller guarantees i+64 <= len.
func commaMask64(base unsafe.Pointer, i int) uint64 {
	p := unsafe.Add(base, i)
	return commaBits(*(*uint64)(p)) |
		commaBits(*(*uint64)(unsafe.Add(p, 8)))<<8 |
		commaBits(*(*uint64)(unsafe.Add(p, 16)))<<16 |
		commaBits(*(*uint64)(unsafe.Add(p, 24)))<<24 |
		commaBits(*(*uint64)(unsafe.Add(p, 32)))<<32 |
		commaBits(*(*uint64)(unsafe.Add(p, 40)))<<40 |
		commaBits(*(*uint64)(unsafe.Add(p, 48)))<<48 |
		commaBits(*(*uint64)(unsafe.Add(p, 56)))<<56
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
// It reads at most runSpan bytes a call and is never inlined: its loops
// have no safe point where the garbage collector could preempt them, and a
// 600 KB array parsed in one go would hold up every collection (and have
// the runtime signal it again and again) for as long as the parse lasts.
// The call's own entry is the safe point.
//
//go:noinline
func tokenRun(b []byte, i int, out []uint32, k int) (int, int) {
	if !littleEndian {
		return i, k
	}
	base := unsafe.Pointer(unsafe.SliceData(b))
	start := i // the first byte of the element being looked for
	limit := min(len(b), i+runSpan)
	for c := i; c+64 <= limit; c += 64 {
		mask := commaMask64(base, c)
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
		}
	}
	return start, k
}
