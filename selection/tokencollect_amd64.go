package selection

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// hasBMI chooses collectCompactBMI over collectCompact.
var hasBMI = cpu.X86.HasBMI1 && cpu.X86.HasBMI2

// collectCompactBMI is collectCompact in assembly with BMI1 and BMI2
// (tokencollect_amd64.s), over the n masks at masks.
//
//go:noescape
func collectCompactBMI(base unsafe.Pointer, masks *uint64, n int, c int, start int, words *uint64) (next int, m int, ok bool)

// collectElements is collectCompact, in BMI assembly where the processor
// has it: the profile of a 100k-token proxied request spends most of its
// parse in this loop.
func collectElements(base unsafe.Pointer, masks []uint64, c, start int, words *[groupBlocks * tokenRunRoom]uint64) (int, int, bool) {
	if hasBMI && len(masks) > 0 {
		return collectCompactBMI(base, &masks[0], len(masks), c, start, &words[0])
	}
	return collectCompact(base, masks, c, start, words)
}
