package selection

import "unsafe"

// The two vectorisable halves of the token-array fast path (tokenrun.go):
// the comma masks of whole blocks (where the commas are in each 64 bytes,
// and whether the block holds anything but digits and commas), and the
// conversion of the elements found between them to numbers. On amd64 with
// AVX2 they run 32 bytes, or four elements, per instruction
// (tokenmask_amd64.s); elsewhere on plain integers (commaMasksWords,
// digitValuesWords).

// groupBlocks is how many blocks tokenRun finds the commas of at once,
// before it parses the elements that end in them.
const groupBlocks = 16

// commaMasksWords writes the comma mask of each of up to len(masks) blocks
// of 64 bytes from p (bit j of masks[g] set when byte 64g+j is ',') and
// returns how many leading blocks hold only digits, commas, and spaces
// that directly follow a comma (blockMask); it stops at the first that
// does not, whose mask it need not write; and whether the blocks it
// wrote hold a space. carry is 1 when the byte before p is a comma. The
// caller guarantees 64*len(masks) readable bytes at p.
func commaMasksWords(p unsafe.Pointer, masks []uint64, carry uint64) (int, bool) {
	spaced := false
	for g := range masks {
		mask, spaces, clean := blockMask(unsafe.Add(p, 64*g), carry)
		if !clean {
			return g, spaced
		}
		masks[g], carry = mask, mask>>63
		spaced = spaced || spaces != 0
	}
	return len(masks), spaced
}

// digitValuesWords writes the number in each word, which holds one to
// eight ASCII digits in its top bytes and zero bytes below (as
// parseDigits shifts them), to dst, one uint32 each. The caller
// guarantees room for len(words) of them.
func digitValuesWords(words []uint64, dst unsafe.Pointer) {
	for j, x := range words {
		x = (x & 0x0F0F0F0F0F0F0F0F) * 2561 >> 8
		x = (x & 0x00FF00FF00FF00FF) * 6553601 >> 16
		*(*uint32)(unsafe.Add(dst, 4*j)) = uint32((x & 0x0000FFFF0000FFFF) * 42949672960001 >> 32)
	}
}
