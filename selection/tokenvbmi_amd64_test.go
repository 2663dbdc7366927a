package selection

import (
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"
)

// TestTokenRunWithoutVBMI runs the token-array tests with the BMI loop
// alone on a processor that has AVX-512 VBMI, so both paths are tested on
// it.
func TestTokenRunWithoutVBMI(t *testing.T) {
	if !hasVBMI {
		t.Skip("no AVX-512 VBMI: the other tests ran without it")
	}
	hasVBMI = false
	defer func() { hasVBMI = true }()
	runTokenTests(t)
}

// The AVX-512 kernel, with the BMI loop after it, and the Go loop agree on
// every group of blocks: where they stop, the values they put and whether
// they took them all, for groups that start anywhere in an element (up to
// and past seven bytes before the group), blocks with up to 32 elements,
// empty elements, long ones and leading zeros, and a group starting at
// the array's first bytes (c < 8, where the kernel is not used).
func TestCollectValuesVBMIMatchesGo(t *testing.T) {
	if !hasVBMI {
		t.Skip("no AVX-512 VBMI")
	}
	rng := rand.New(rand.NewPCG(15, 34))
	const trials = 30_000
	whole, dense, taken := 0, 0, 0 // taken: trials where the kernel took a block
	for trial := range trials {
		g := 1 + rng.IntN(groupBlocks)
		pre := rng.IntN(24) // bytes before the group: c
		b := make([]byte, 0, pre+64*g+80)
		short := trial%5 == 4 // blocks of one- and two-digit elements
		for len(b) < pre+64*g+72 {
			switch r := rng.IntN(300); {
			case r == 0 && trial%5 == 0:
				b = append(b, ',') // an empty element
			case r == 1 && trial%5 == 1:
				b = append(b, "123456789,"...) // nine digits
			case r == 2 && trial%5 == 2:
				b = append(b, "0123,"...) // a leading zero
			case r < 12:
				b = append(b, "0,"...)
			case short:
				b = append(b, byte('1'+rng.IntN(9)))
				if rng.IntN(2) == 0 {
					b = append(b, byte('0'+rng.IntN(10)))
				}
				b = append(b, ',')
			default:
				b = append(b, byte('1'+rng.IntN(9)))
				for range rng.IntN(8) {
					b = append(b, byte('0'+rng.IntN(10)))
				}
				b = append(b, ',')
			}
		}
		// The element being looked for begins after the last comma
		// before c, or at 0.
		start := 0
		for k := pre - 1; k >= 0; k-- {
			if b[k] == ',' {
				start = k + 1
				break
			}
		}
		var masks [groupBlocks]uint64
		for k := range 64 * g {
			if b[pre+k] == ',' {
				masks[k/64] |= 1 << (k % 64)
			}
		}
		for _, mk := range masks[:g] {
			if bits.OnesCount64(mk) > 16 {
				dense++
				break
			}
		}
		base := unsafe.Pointer(unsafe.SliceData(b))
		var words [groupBlocks * tokenRunRoom]uint64
		var want, got [groupBlocks * tokenRunRoom]uint32
		wantNext, wantM, wantOK := collectCompact(base, masks[:g], pre, start, &words)
		digitValuesWords(words[:wantM], unsafe.Pointer(&want[0]))
		// As tokenRun does: the kernel's blocks, then the checking loop's.
		gotNext, gotM, done := collectValues(base, masks[:g], pre, start, unsafe.Pointer(&got[0]))
		gotOK := true
		if done < g {
			var rest int
			gotNext, rest, gotOK = collectElements(base, masks[done:g], pre+64*done, gotNext, &words)
			digitValuesWords(words[:rest], unsafe.Pointer(&got[gotM]))
			gotM += rest
		}
		if wantOK {
			whole++
		}
		if pre >= 8 && done > 0 {
			taken++
		}
		if gotNext != wantNext || gotM != wantM || gotOK != wantOK || !slices.Equal(got[:gotM], want[:wantM]) {
			t.Fatalf("trial %d (%d blocks from %d, element from %d): AVX-512 (%d, %d, %v), Go (%d, %d, %v)\n%s",
				trial, g, pre, start, gotNext, gotM, gotOK, wantNext, wantM, wantOK, b[:pre+64*g])
		}
	}
	if whole < trials/10 || whole > trials*9/10 || dense == 0 || taken < trials/2 {
		t.Fatalf("%d of %d trials took every element, %d had a block of over 16, the kernel took blocks in %d: the cases are not mixed",
			whole, trials, dense, taken)
	}
}
