package selection

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/zeebo/xxh3"
)

// TestNextSequenceHashIsXXH3: the written-out chaining step gives what the
// xxh3 library gives for the same 16 bytes and seed, on edge values and on
// a million random pairs.
func TestNextSequenceHashIsXXH3(t *testing.T) {
	viaLibrary := func(prev, block uint64) uint64 {
		var b [16]byte
		binary.LittleEndian.PutUint64(b[:8], prev)
		binary.LittleEndian.PutUint64(b[8:], block)
		return xxh3.HashSeed(b[:], HashSeed)
	}
	edges := []uint64{0, 1, HashSeed, 1<<63 - 1, 1 << 63, ^uint64(0)}
	for _, p := range edges {
		for _, b := range edges {
			if got, want := NextSequenceHash(p, b), viaLibrary(p, b); got != want {
				t.Fatalf("NextSequenceHash(%#x, %#x) = %#x, xxh3 gives %#x", p, b, got, want)
			}
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 1_000_000 {
		p, b := rng.Uint64(), rng.Uint64()
		if got, want := NextSequenceHash(p, b), viaLibrary(p, b); got != want {
			t.Fatalf("NextSequenceHash(%#x, %#x) = %#x, xxh3 gives %#x", p, b, got, want)
		}
	}
}

// BenchmarkNextSequenceHash compares the written-out step with the
// library's general entry point on the same inputs.
func BenchmarkNextSequenceHash(b *testing.B) {
	var b16 [16]byte
	b.Run("written-out", func(b *testing.B) {
		h := uint64(1)
		for b.Loop() {
			h = NextSequenceHash(h, 42)
		}
		_ = h
	})
	b.Run("library", func(b *testing.B) {
		h := uint64(1)
		for b.Loop() {
			binary.LittleEndian.PutUint64(b16[:8], h)
			binary.LittleEndian.PutUint64(b16[8:], 42)
			h = xxh3.HashSeed(b16[:], HashSeed)
		}
		_ = h
	})
}
