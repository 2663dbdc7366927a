package selection

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// hasVBMI chooses collectValuesVBMI for the blocks it can take: AVX-512
// with byte permutes (VBMI) and byte compression (VBMI2), and BMI2.
var hasVBMI = cpu.X86.HasAVX512 && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VBMI && cpu.X86.HasAVX512VBMI2 && hasBMI

// collectValuesVBMI is collectCompact then digitValues for the leading
// blocks of masks[0:n] whose elements all pass collectCompact's checks,
// in AVX-512 (tokenvbmi_amd64.s); done says how many blocks it took.
//
//go:noescape
func collectValuesVBMI(base unsafe.Pointer, masks *uint64, n int, c int, start int, dst *uint32) (next int, m int, done int)

// collectValues parses the elements of the leading blocks of masks (from
// c, the element being looked for beginning at start) that the AVX-512
// kernel can take, straight to their values at dst, and returns where the
// next element begins, how many it wrote and how many blocks it took:
// none where the processor has no AVX-512 VBMI, or at c < 8 (the kernel
// reads the eight bytes before the group). The caller guarantees room at
// dst for 32 values a block, and takes the blocks left with
// collectElements. The profile of a 100k-token proxied request spent
// most of its parse in the element loop that this replaces.
func collectValues(base unsafe.Pointer, masks []uint64, c, start int, dst unsafe.Pointer) (int, int, int) {
	if !hasVBMI || len(masks) == 0 || c < 8 {
		return start, 0, 0
	}
	return collectValuesVBMI(base, &masks[0], len(masks), c, start, (*uint32)(dst))
}
