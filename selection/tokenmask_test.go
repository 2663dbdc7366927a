package selection

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// referenceCommaMasks is commaMasks's contract one byte at a time: b[0]
// is the byte before the blocks.
func referenceCommaMasks(b []byte, masks []uint64) int {
	for g := range masks {
		var m uint64
		for j := range 64 {
			at := 1 + 64*g + j
			switch c := b[at]; {
			case c == ',':
				m |= 1 << j
			case c == ' ' && b[at-1] == ',':
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
// byte-at-a-time contract, on runs of blocks of digits, commas and ", "
// with an odd byte at a random place in some: the neighbours of '0', '9',
// ',' and ' ' in the byte order, their values with the high bit set,
// which a signed byte comparison would take for digits, and a space that
// follows no comma (first in a block, with and without a comma before the
// blocks).
func TestCommaMasksAgainstReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	odd := []byte{'/', ':', '+', '-', '.', ' ', '!', 0x1F, '\n', '\t', 0x00, 0x80, 0xA0, 0xAC, 0xB0, 0xB9, 0xFF, '"', ']'}
	for iter := range 20000 {
		nb := 1 + rng.IntN(groupBlocks)
		b := make([]byte, 1+64*nb) // b[0]: the byte before the blocks
		spaced := rng.IntN(2) == 0
		for i := range b {
			switch {
			case spaced && i > 0 && b[i-1] == ',':
				b[i] = ' '
			case rng.IntN(6) == 0:
				b[i] = ','
			default:
				b[i] = '0' + byte(rng.IntN(10))
			}
		}
		switch rng.IntN(4) {
		case 0:
			b[1+rng.IntN(len(b)-1)] = odd[rng.IntN(len(odd))]
		case 1:
			b[1+64*rng.IntN(nb)] = ' '
		}
		var carry uint64
		if b[0] == ',' {
			carry = 1
		}
		want := make([]uint64, nb)
		wg := referenceCommaMasks(b, want)
		for name, f := range map[string]func(unsafe.Pointer, []uint64, uint64) (int, bool){"words": commaMasksWords, "commaMasks": commaMasks} {
			got := make([]uint64, nb)
			g, spaced := f(unsafe.Pointer(&b[1]), got, carry)
			if ws := bytes.IndexByte(b[1:1+64*wg], ' ') >= 0; spaced != ws {
				t.Fatalf("iter %d, %s: spaces in the %d clean blocks: %v, want %v", iter, name, g, spaced, ws)
			}
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
