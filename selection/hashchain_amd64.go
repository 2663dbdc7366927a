package selection

import "golang.org/x/sys/cpu"

// hasAVX512DQ chooses chainedHashes64AVX512 for prompts of 64-byte blocks.
var hasAVX512DQ = cpu.X86.HasAVX512 && cpu.X86.HasAVX512DQ

// chainedHashes64AVX512 hashes 8*groups blocks of 64 bytes and chains
// them on prev (or from the first, when first is set), eight blocks at
// once (hashchain_amd64.s).
//
//go:noescape
func chainedHashes64AVX512(tokens *uint32, groups int, seed uint64, blocks *uint64, seqs *uint64, prev uint64, first bool)

// hashSpan is how many blocks one kernel call hashes at most (a few
// microseconds): assembly has no point where the garbage collector can
// preempt it, so a long prompt is hashed in calls with the loop's own
// preemption points between them, as tokenRun parses in runSpan.
const hashSpan = 1024

// chainedBlocks64 puts the block hashes of the leading blocks of 16
// tokens (64 bytes) into blocks and their sequence hashes into seqs (none
// when seqs is nil), a multiple of eight of them, as many as there are
// whole groups of eight in n, and returns how many: none where the
// processor has no AVX-512DQ. The caller hashes the rest, chaining on
// from seqs[done-1].
func chainedBlocks64(tokens []uint32, n int, seed uint64, blocks, seqs []uint64) int {
	done := n &^ 7
	if !hasAVX512DQ || done == 0 || len(tokens) < 16*done || len(blocks) < done || seqs != nil && len(seqs) < done {
		return 0
	}
	var prev uint64
	for i := 0; i < done; i += hashSpan {
		k := min(done-i, hashSpan)
		if seqs == nil {
			chainedHashes64AVX512(&tokens[16*i], k/8, seed, &blocks[i], nil, 0, false)
			continue
		}
		chainedHashes64AVX512(&tokens[16*i], k/8, seed, &blocks[i], &seqs[i], prev, i == 0)
		prev = seqs[i+k-1]
	}
	return done
}
