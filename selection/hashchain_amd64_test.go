package selection

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestAppendChainedHashesWithoutAVX512 runs the one-pass test with the
// Go loop alone on a processor that has AVX-512, so both paths are tested
// on it.
func TestAppendChainedHashesWithoutAVX512(t *testing.T) {
	if !hasAVX512DQ {
		t.Skip("no AVX-512: the other tests ran the loop")
	}
	hasAVX512DQ = false
	defer func() { hasAVX512DQ = true }()
	TestAppendChainedHashesMatchesTwoLoops(t)
}

// The kernel hashes every block of a 100k-token prompt as the library
// does, and took them: a prompt of 6,250 blocks is 781 groups of eight
// and two blocks for the loop.
func TestChainedBlocks64TakesWholeGroups(t *testing.T) {
	if !hasAVX512DQ {
		t.Skip("no AVX-512")
	}
	rng := rand.New(rand.NewPCG(7, 8))
	tokens := make([]uint32, 100_000)
	for i := range tokens {
		tokens[i] = rng.Uint32()
	}
	bs, ss := make([]uint64, 6250), make([]uint64, 6250)
	if done := chainedBlocks64(tokens, 6250, HashSeed, bs, ss); done != 6248 {
		t.Fatalf("took %d blocks, want 6248", done)
	}
	want := libraryBlockHashes(nil, tokens, 16, HashOptions{}) // AppendBlockHashes takes the kernel itself
	wantSeq := AppendSequenceHashes(nil, want)
	if !slices.Equal(bs[:6248], want[:6248]) || !slices.Equal(ss[:6248], wantSeq[:6248]) {
		t.Fatal("the kernel's hashes differ from the library's")
	}
}
