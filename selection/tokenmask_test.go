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

// TestDigitValuesAgainstParseDigits converts runs of every length (the
// vector path takes them four at a time, the word loop the rest) of
// elements of one to eight random digits, the extremes among them, with
// both converters, and checks each value against parseDigits and the
// number itself.
func TestDigitValuesAgainstParseDigits(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 2))
	for iter := range 3000 {
		count := rng.IntN(40)
		words := make([]uint64, count)
		want := make([]uint32, count)
		for j := range words {
			n := 1 + rng.IntN(8)
			digits := make([]byte, 8)
			var v uint32
			for d := range n {
				c := byte('0' + rng.IntN(10))
				switch iter % 3 {
				case 1:
					c = '9'
				case 2:
					c = '0' + byte(d%2)
				}
				digits[d] = c
				v = v*10 + uint32(c-'0')
			}
			copy(digits[n:], ",123456") // what follows an element in a body
			var x uint64
			for d := 7; d >= 0; d-- {
				x = x<<8 | uint64(digits[d])
			}
			if uint32(parseDigits(x, n)) != v {
				t.Fatalf("parseDigits(%q, %d) = %d, want %d", digits, n, parseDigits(x, n), v)
			}
			words[j], want[j] = x<<(64-8*n), v
		}
		for name, f := range map[string]func([]uint64, unsafe.Pointer){"words": digitValuesWords, "digitValues": digitValues} {
			got := make([]uint32, count+1)
			got[count] = 0xDEADBEEF
			if count > 0 {
				f(words, unsafe.Pointer(&got[0]))
			}
			for j := range count {
				if got[j] != want[j] {
					t.Fatalf("iter %d, %s: element %d of %d is %d, want %d", iter, name, j, count, got[j], want[j])
				}
			}
			if got[count] != 0xDEADBEEF {
				t.Fatalf("iter %d, %s: wrote past %d elements", iter, name, count)
			}
		}
	}
}
