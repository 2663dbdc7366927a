package selection

import (
	"math/rand/v2"
	"testing"
	"unsafe"
)

// TestTokenRunWithoutBMI runs the token-array tests with collectCompact
// in Go on a processor that has BMI, so both paths of collectElements are
// tested on it.
func TestTokenRunWithoutBMI(t *testing.T) {
	if !hasBMI {
		t.Skip("no BMI: the Go loop is what the other tests ran")
	}
	hasBMI, hasVBMI = false, false
	defer func(vbmi bool) { hasBMI, hasVBMI = true, vbmi }(hasVBMI)
	runTokenTests(t)
}

// runTokenTests runs the token array's tests as subtests, for the tests
// that turn a kernel off first.
func runTokenTests(t *testing.T) {
	t.Run("AgainstEncodingJSON", TestTokenRunAgainstEncodingJSON)
	t.Run("BlockBorders", TestTokenRunBlockBorders)
	t.Run("ReusedSlice", TestTokenArrayReusedSlice)
}

// The assembly and the Go loop agree on every group of blocks: where they
// stop, what they take and whether they took it all, for arrays with
// empty elements, long ones and leading zeros mixed in.
func TestCollectCompactBMIMatchesGo(t *testing.T) {
	if !hasBMI {
		t.Skip("no BMI")
	}
	rng := rand.New(rand.NewPCG(15, 33))
	const trials = 20_000
	whole := 0 // trials whose every element was taken
	for trial := range trials {
		g := 1 + rng.IntN(groupBlocks)
		b := make([]byte, 0, 64*g+72)
		for len(b) < 64*g+64 {
			switch r := rng.IntN(200); {
			case r == 0 && trial%4 == 0:
				b = append(b, ',') // an empty element
			case r == 1 && trial%4 == 1:
				b = append(b, "123456789,"...) // nine digits
			case r == 2 && trial%4 == 2:
				b = append(b, "0123,"...) // a leading zero
			case r < 10:
				b = append(b, "0,"...)
			default:
				b = append(b, byte('1'+rng.IntN(9)))
				for range rng.IntN(8) {
					b = append(b, byte('0'+rng.IntN(10)))
				}
				b = append(b, ',')
			}
		}
		var masks [groupBlocks]uint64
		for k := range 64 * g {
			if b[k] == ',' {
				masks[k/64] |= 1 << (k % 64)
			}
		}
		base := unsafe.Pointer(unsafe.SliceData(b))
		var wantWords, gotWords [groupBlocks * tokenRunRoom]uint64
		wantNext, wantM, wantOK := collectCompact(base, masks[:g], 0, 0, &wantWords)
		gotNext, gotM, gotOK := collectCompactBMI(base, &masks[0], g, 0, 0, &gotWords[0])
		if wantOK {
			whole++
		}
		if gotNext != wantNext || gotM != wantM || gotOK != wantOK || gotWords != wantWords {
			t.Fatalf("trial %d (%d blocks): assembly (%d, %d, %v), Go (%d, %d, %v), words equal %v\n%s",
				trial, g, gotNext, gotM, gotOK, wantNext, wantM, wantOK, gotWords == wantWords, b[:64*g])
		}
	}
	if whole < trials/4 || whole > trials*3/4 {
		t.Fatalf("%d of %d trials took every element: the cases are not mixed", whole, trials)
	}
}
