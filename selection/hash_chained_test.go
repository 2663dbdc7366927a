package selection

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestAppendChainedHashesMatchesTwoLoops: the one-pass hashing gives, for
// random prompts of every length around the block boundaries, seeds,
// Eagle windows and multimodal blocks, exactly AppendBlockHashes then
// AppendSequenceHashes (the xxh3 library's hashes), appended after what
// the slices already held. With 16-token blocks this tests the AVX-512
// kernel where the processor has it (hashchain_amd64.s), and the loop
// for the blocks after the last group of eight.
func TestAppendChainedHashesMatchesTwoLoops(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 3))
	for trial := range 3000 {
		blockSize := []int{1, 4, 16, 16, 16, 32, 64}[rng.IntN(7)]
		n := rng.IntN(40*blockSize + 3) // up to 40 blocks: several groups of eight
		if trial%10 == 0 {
			n = rng.IntN(2000) // long prompts
		}
		tokens := make([]uint32, n)
		for i := range tokens {
			tokens[i] = rng.Uint32()
		}
		opt := HashOptions{Eagle: rng.IntN(3) == 0}
		switch rng.IntN(4) {
		case 0:
			opt.Seed = SaltedSeed("lora", "")
		case 1:
			opt.Seed = rng.Uint64() // any seed, carries and borrows in the keys
		case 2:
			opt.Seed = ^uint64(0) - uint64(rng.IntN(3))
		}
		if rng.IntN(5) == 0 {
			opt.MM = []*BlockMMInfo{nil, {MMObjects: []MMObject{{MMHash: rng.Uint64()}, {MMHash: 7}}}}
		}
		// What the caller's slices held before: kept, and appended to.
		head := []uint64{rng.Uint64()}
		wantBlocks := AppendBlockHashes(slices.Clone(head), tokens, blockSize, opt)
		wantSeqs := AppendSequenceHashes(slices.Clone(head), wantBlocks[1:])
		gotBlocks, gotSeqs := AppendChainedHashes(slices.Clone(head), slices.Clone(head), tokens, blockSize, opt)
		if !slices.Equal(gotBlocks, wantBlocks) || !slices.Equal(gotSeqs, wantSeqs) {
			t.Fatalf("trial %d (n %d, block %d, %+v): chained hashes differ from the two loops", trial, n, blockSize, opt)
		}
	}
}

// TestAppendChainedHashesAllocatesNothingWithRoom: given room, the one
// pass allocates nothing, as the proxy path reuses its scratch.
func TestAppendChainedHashesAllocatesNothingWithRoom(t *testing.T) {
	tokens := make([]uint32, 100_000)
	blocks, seqs := make([]uint64, 0, 6250), make([]uint64, 0, 6250)
	if a := testing.AllocsPerRun(10, func() {
		blocks, seqs = AppendChainedHashes(blocks[:0], seqs[:0], tokens, 16, HashOptions{})
	}); a != 0 {
		t.Fatalf("%v allocations a call", a)
	}
	if len(blocks) != 6250 || len(seqs) != 6250 {
		t.Fatal(len(blocks), len(seqs))
	}
}

// BenchmarkPromptHashes100k: the block and sequence hashes of a
// 100k-token prompt (16-token blocks), in one pass and in the two loops.
func BenchmarkPromptHashes100k(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	tokens := make([]uint32, 100_000)
	for i := range tokens {
		tokens[i] = uint32(rng.IntN(150000))
	}
	blocks, seqs := make([]uint64, 0, 6250), make([]uint64, 0, 6250)
	b.Run("one_pass", func(b *testing.B) {
		for b.Loop() {
			blocks, seqs = AppendChainedHashes(blocks[:0], seqs[:0], tokens, 16, HashOptions{})
		}
	})
	b.Run("two_loops", func(b *testing.B) {
		for b.Loop() {
			blocks = AppendBlockHashes(blocks[:0], tokens, 16, HashOptions{})
			seqs = AppendSequenceHashes(seqs[:0], blocks)
		}
	})
}
