package selection

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// hasVBMI chooses collectCompactVBMI for the blocks it can take: AVX-512
// with byte permutes (VBMI) and byte compression (VBMI2), and BMI2.
var hasVBMI = cpu.X86.HasAVX512 && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VBMI && cpu.X86.HasAVX512VBMI2 && hasBMI

// collectCompactVBMI is collectCompact for the leading blocks of masks[0:n]
// whose elements all pass its checks, in AVX-512 (tokenvbmi_amd64.s); done
// says how many blocks it took.
//
//go:noescape
func collectCompactVBMI(base unsafe.Pointer, masks *uint64, n int, c int, start int, words *uint64) (next int, m int, done int)
