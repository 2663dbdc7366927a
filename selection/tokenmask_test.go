package selection

import (
	"math/rand/v2"
	"testing"
	"unsafe"
)

// referenceCommaMasks is commaMasks's contract one byte at a time.
func referenceCommaMasks(b []byte, masks []uint64) int {
	for g := range masks {
		var m uint64
		for j, c := range b[64*g : 64*g+64] {
			switch {
			case c == ',':
				m |= 1 << j
			case c >= '0' && c <= '9':
			default:
				return g
			}
		}
		masks[g] = m
	}
	return len(masks)
}

// TestCommaMasksAgainstReference checks both mask builders (the vector one
// where the processor has it, and the word one everywhere) against the
// byte-at-a-time contract, on runs of blocks of digits and commas with an
// odd byte at a random place in some: the neighbours of '0', '9' and ','
// in the byte order, and their values with the high bit set, which a
// signed byte comparison would take for digits.
func TestCommaMasksAgainstReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	odd := []byte{'/', ':', '+', '-', '.', ' ', 0x00, 0x80, 0xAC, 0xB0, 0xB9, 0xFF, '"', ']'}
	for iter := range 20000 {
		nb := 1 + rng.IntN(groupBlocks)
		b := make([]byte, 64*nb)
		for i := range b {
			if rng.IntN(6) == 0 {
				b[i] = ','
			} else {
				b[i] = '0' + byte(rng.IntN(10))
			}
		}
		if rng.IntN(2) == 0 {
			b[rng.IntN(len(b))] = odd[rng.IntN(len(odd))]
		}
		want := make([]uint64, nb)
		wg := referenceCommaMasks(b, want)
		for name, f := range map[string]func(unsafe.Pointer, []uint64) int{"words": commaMasksWords, "commaMasks": commaMasks} {
			got := make([]uint64, nb)
			g := f(unsafe.Pointer(&b[0]), got)
			if g != wg {
				t.Fatalf("iter %d, %s: %d clean blocks, want %d", iter, name, g, wg)
			}
			for j := range g {
				if got[j] != want[j] {
					t.Fatalf("iter %d, %s: block %d mask %064b, want %064b", iter, name, j, got[j], want[j])
				}
			}
		}
	}
}
