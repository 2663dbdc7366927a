//go:build !amd64

package selection

// chainedBlocks64 hashes no block where there is no vector kernel: the
// caller's loop hashes them all.
func chainedBlocks64(tokens []uint32, n int, seed uint64, blocks, seqs []uint64) int { return 0 }
