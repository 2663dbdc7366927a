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
// parse in this loop. Where it also has AVX-512 VBMI, the blocks whose
// elements all pass the checks (nearly every block of a token array) are
// taken sixteen elements an instruction (collectCompactVBMI), and the
// BMI loop takes the rest, from the first block that needs it, and says
// which element fails. The vector kernel reads the eight bytes before the
// group, so it starts only at c >= 8.
func collectElements(base unsafe.Pointer, masks []uint64, c, start int, words *[groupBlocks * tokenRunRoom]uint64) (int, int, bool) {
	if hasVBMI && len(masks) > 0 && c >= 8 {
		next, m, done := collectCompactVBMI(base, &masks[0], len(masks), c, start, &words[0])
		if done == len(masks) {
			return next, m, true
		}
		// m <= 16*done, and the rest put at most 32 a block: in words.
		next, rest, ok := collectCompactBMI(base, &masks[done], len(masks)-done, c+64*done, next, &words[m])
		return next, m + rest, ok
	}
	if hasBMI && len(masks) > 0 {
		return collectCompactBMI(base, &masks[0], len(masks), c, start, &words[0])
	}
	return collectCompact(base, masks, c, start, words)
}
