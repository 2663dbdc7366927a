package indexer

import "golang.org/x/sys/cpu"

// hasIDVBMI chooses the AVX-512 kernels (readIDBlocksVBMI, then
// readIDQuadsVBMI) for runs of token ids: AVX-512 with byte permutes
// (VBMI), and BMI1/BMI2 and POPCNT for the masks' bit counts.
var hasIDVBMI = cpu.X86.HasAVX512 && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VBMI &&
	cpu.X86.HasBMI1 && cpu.X86.HasBMI2 && cpu.X86.HasPOPCNT

// readIDQuadsVBMI is readIDQuads' loop in AVX-512 (idvbmi_amd64.s),
// sixteen ids a step: from id k at byte i, it takes the quads the Go loop
// would and returns where that loop would stop.
//
//go:noescape
func readIDQuadsVBMI(out []uint32, b []byte, k, i int) (int, int)

// readIDBlocksVBMI takes the bulk of a run 64 bytes at a time
// (idblocks_amd64.s), where readIDQuadsVBMI's steps would wait on each
// other: from id k at byte i, quads the Go loop would take, to a place that
// loop passes through; it leaves the run's last 84 bytes and the quad
// where another encoding is to readIDQuadsVBMI.
//
//go:noescape
func readIDBlocksVBMI(out []uint32, b []byte, k, i int) (int, int)

// idSpan is how many ids one kernel call reads at most (about two
// microseconds): assembly has no point where the garbage collector can
// preempt it, and a 4 MiB payload holds a million ids, so a long run is
// read in calls with the loop's own preemption points between them.
const idSpan = 4096

// blockTail is how close to the end of b readIDBlocksVBMI may stop short
// of where the Go loop would: it takes no block with fewer than 84 bytes
// from it, and may go back into the block before.
const blockTail = 84 + 64

// readIDQuadsVector takes what readIDQuads' loop would from id k at byte
// i, in the AVX-512 kernel, and returns where it stopped; it takes nothing
// where the processor has no AVX-512 VBMI, and the Go loop runs instead.
func readIDQuadsVector(out []uint32, b []byte, k, i int) (int, int) {
	if !hasIDVBMI {
		return k, i
	}
	for {
		end := min(len(out), k+idSpan)
		k, i = readIDBlocksVBMI(out[:end], b, k, i)
		// The blocks stop where the Go loop does, or within 84+64 bytes
		// of b's end, where the window kernel goes on.
		if len(b)-i < blockTail {
			k, i = readIDQuadsVBMI(out[:end], b, k, i)
		}
		// Stopped short of its span's end: a quad the Go loop would
		// not take either, or too few bytes.
		if end == len(out) || end-k >= 4 {
			return k, i
		}
	}
}
