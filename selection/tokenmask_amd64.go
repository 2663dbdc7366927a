package selection

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// hasAVX2 chooses commaMasksAVX2 over commaMasksWords.
var hasAVX2 = cpu.X86.HasAVX2

// commaMasksAVX2 is commaMasksWords in AVX2 (tokenmask_amd64.s): n blocks
// from p, masks written to masks[0:n].
//
//go:noescape
func commaMasksAVX2(p unsafe.Pointer, n int, masks *uint64, carry uint64) (int, bool)

// commaMasks is commaMasksWords, in AVX2 where the processor has it.
func commaMasks(p unsafe.Pointer, masks []uint64, carry uint64) (int, bool) {
	if hasAVX2 && len(masks) > 0 {
		return commaMasksAVX2(p, len(masks), &masks[0], carry)
	}
	return commaMasksWords(p, masks, carry)
}

// digitValuesAVX2 is digitValuesWords in AVX2 (tokenmask_amd64.s), for n
// a multiple of 4.
//
//go:noescape
func digitValuesAVX2(words *uint64, n int, dst *uint32)

// digitValues is digitValuesWords, four words at a time in AVX2 where the
// processor has it.
func digitValues(words []uint64, dst unsafe.Pointer) {
	if hasAVX2 && len(words) >= 4 {
		n := len(words) &^ 3
		digitValuesAVX2(&words[0], n, (*uint32)(dst))
		words, dst = words[n:], unsafe.Add(dst, 4*n)
	}
	digitValuesWords(words, dst)
}
