package selection

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/zeebo/xxh3"
)

// libraryBlockHashes is the xxh3 library's hash of each block's window of
// little-endian tokens, block by block: what AppendBlockHashes must give
// whichever path it takes (multimodal blocks, which no kernel takes, are
// left to it).
func libraryBlockHashes(dst []uint64, tokens []uint32, blockSize int, opt HashOptions) []uint64 {
	if len(opt.MM) > 0 {
		return AppendBlockHashes(dst, tokens, blockSize, opt)
	}
	seed, window := opt.seedWindow(blockSize)
	for i := range BlockCount(len(tokens), blockSize, opt.Eagle) {
		var b []byte
		for _, tok := range tokens[i*blockSize : i*blockSize+window] {
			b = binary.LittleEndian.AppendUint32(b, tok)
		}
		dst = append(dst, xxh3.HashSeed(b, seed))
	}
	return dst
}

// TestAppendChainedHashesMatchesTwoLoops: the one-pass hashing gives, for
// random prompts of every length around the block boundaries, seeds,
// Eagle windows (among them 16 tokens over 15-token blocks, as long as
// the kernel's blocks but not as far apart) and multimodal blocks,
// exactly the xxh3 library's block hashes then AppendSequenceHashes, and
// AppendBlockHashes the same block hashes, appended after what the slices
// already held. With 16-token blocks this tests the AVX-512 kernel where
// the processor has it (hashchain_amd64.s), and the loop for the blocks
// after the last group of eight.
func TestAppendChainedHashesMatchesTwoLoops(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 3))
	for trial := range 3000 {
		blockSize := []int{1, 4, 15, 16, 16, 16, 32, 64}[rng.IntN(8)]
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
		wantBlocks := libraryBlockHashes(slices.Clone(head), tokens, blockSize, opt)
		wantSeqs := AppendSequenceHashes(slices.Clone(head), wantBlocks[1:])
		if got := AppendBlockHashes(slices.Clone(head), tokens, blockSize, opt); !slices.Equal(got, wantBlocks) {
			t.Fatalf("trial %d (n %d, block %d, %+v): block hashes differ from the library's", trial, n, blockSize, opt)
		}
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
