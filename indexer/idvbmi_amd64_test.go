package indexer

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestDecodeWithoutIDVBMI runs the decoder's tests with readIDQuads' Go
// loop alone on a processor that has AVX-512 VBMI, so that both paths are
// tested on it, and a machine without it runs the same path as this one.
func TestDecodeWithoutIDVBMI(t *testing.T) {
	if !hasIDVBMI {
		t.Skip("no AVX-512 VBMI: the other tests ran the Go loop")
	}
	hasIDVBMI = false
	defer func() { hasIDVBMI = true }()
	t.Run("TokenWidths", TestDecodeTokenWidths)
	t.Run("Encodings", TestDecodeEncodings)
	t.Run("RoundTrip", TestEncoderRoundTrip)
	t.Run("RejectsMalformed", TestDecodeRejectsMalformed)
	t.Run("SGLangPageStream", TestSGLangPageStream)
	t.Run("BatchMatchesApply", TestApplyBatchMatchesApply)
	t.Run("RemovalEvents", TestRemovalEventsMatchModel)
	t.Run("IDRuns", TestReadIDsMatchesGoLoop)
}

// idRun is a random run of token ids for the kernel's tests: mostly the
// 16- and 32-bit encodings the kernel takes, at times the others (fixint,
// 0xcc, 64-bit and signed forms, a bigram pair) among them, after pre
// bytes that are not ids, and cut anywhere, mid-element too.
func idRun(rng *rand.Rand, trial int) (b []byte, pre int) {
	pre = rng.IntN(16)
	for range pre {
		b = append(b, byte(rng.IntN(256)))
	}
	n := rng.IntN(200)
	// One trial in four only 0xcd and 0xce; the others with the rest mixed
	// in at one id in rare.
	rare := []int{0, 400, 60, 8}[trial%4]
	for range n {
		switch r := rng.IntN(1000); {
		case rare > 0 && r < rare/4:
			b = append(b, byte(rng.IntN(0x80))) // fixint
		case rare > 0 && r < rare/2:
			b = append(b, 0xcc, byte(rng.IntN(0x100)))
		case rare > 0 && r < rare*3/4:
			b = appendTokenAnyWidth(b, uint32(rng.IntN(0x8000)), 4+rng.IntN(5)) // 0xcf, signed forms
		case rare > 0 && r < rare:
			b = append(b, 0x92, 0xcd, 0x12, 0x34, 0x05) // a bigram pair
		case r%2 == 0:
			b = append(b, 0xcd, byte(rng.IntN(256)), byte(rng.IntN(256)))
		default:
			b = append(b, 0xce, byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256)))
		}
	}
	if len(b) > pre && rng.IntN(2) == 0 {
		b = b[:pre+rng.IntN(len(b)-pre)] // the buffer ends anywhere
	}
	return b, pre
}

// goIDQuads is readIDQuads with the kernel off: the Go loop alone.
func goIDQuads(out []uint32, b []byte, k, i int) (int, int) {
	on := hasIDVBMI
	hasIDVBMI = false
	defer func() { hasIDVBMI = on }()
	return readIDQuads(out, b, k, i)
}

// The kernel and the Go loop agree on every run: the ids they put, where
// they stop (id and byte), and that neither writes a slot of out past the
// ids it took, for runs of mixed encodings at every offset, out of every
// length and buffers ending mid-element.
func TestReadIDQuadsVBMIMatchesGo(t *testing.T) {
	if !hasIDVBMI {
		t.Skip("no AVX-512 VBMI")
	}
	rng := rand.New(rand.NewPCG(15, 2))
	const trials = 40_000
	const sentinel = 0xdeadbeef
	long, short := 0, 0 // trials where the kernel took 16 ids or more, fewer
	for trial := range trials {
		b, pre := idRun(rng, trial)
		k0 := rng.IntN(6)
		n := k0 + rng.IntN(210)
		want := make([]uint32, n+20)
		got := make([]uint32, n+20)
		for j := range want {
			want[j], got[j] = sentinel, sentinel
		}
		wk, wi := goIDQuads(want[:n], b, k0, pre)
		gk, gi := readIDQuadsVBMI(got[:n], b, k0, pre)
		if gk != wk || gi != wi || !slices.Equal(got, want) {
			t.Fatalf("trial %d (%d bytes from %d, out %d from %d): AVX-512 (%d, %d), Go (%d, %d)\ngot  %x\nwant %x\n% x",
				trial, len(b), pre, n, k0, gk, gi, wk, wi, got[k0:gk], want[k0:wk], b)
		}
		switch taken := gk - k0; {
		case taken >= 16:
			long++
		case taken > 0:
			short++
		}
	}
	if long < trials/3 || short < trials/20 {
		t.Fatalf("the kernel took 16 ids or more in %d of %d trials and 1-15 in %d: the cases are not mixed", long, trials, short)
	}
}

// readIDs, and so readTokens, returns the same with the kernel as
// without, over whole runs: the kernel hands the Go loops the same place
// to go on from.
func TestReadIDsMatchesGoLoop(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 3))
	for trial := range 10_000 {
		b, pre := idRun(rng, trial)
		n := rng.IntN(210)
		out := make([]uint32, n)
		k, i := readIDs(out, b, pre)
		on := hasIDVBMI
		hasIDVBMI = false
		wantOut := make([]uint32, n)
		wk, wi := readIDs(wantOut, b, pre)
		hasIDVBMI = on
		if k != wk || i != wi || !slices.Equal(out[:k], wantOut[:wk]) {
			t.Fatalf("trial %d: (%d, %d), Go loop alone (%d, %d)", trial, k, i, wk, wi)
		}
	}
}

// A run longer than one kernel call's span is read in several calls that
// together take what the Go loop takes.
func TestReadIDQuadsVectorSpans(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 4))
	const n = 3*idSpan + 7
	want := make([]uint32, n)
	var b []byte
	for j := range want {
		want[j] = uint32(0x100 + rng.IntN(150_000))
		b = appendTokenAnyWidth(b, want[j], 0) // the shortest: 0xcd or 0xce
	}
	out := make([]uint32, n)
	k, i := readIDQuads(out, b, 0, 0)
	wk, wi := goIDQuads(make([]uint32, n), b, 0, 0)
	if k != wk || i != wi || k < n-3 || !slices.Equal(out[:k], want[:k]) {
		t.Fatalf("read %d of %d ids to byte %d of %d; the Go loop %d to %d", k, n, i, len(b), wk, wi)
	}
	if !hasIDVBMI {
		return
	}
	if k, _ := readIDQuadsVector(out, b, 0, 0); k != wk {
		t.Fatalf("the kernel's calls stopped at id %d, the Go loop at %d", k, wk)
	}
}

// BenchmarkReadIDs reads the token ids of BenchmarkDecodeApply's stores
// alone (256 ids below 150,000: 0xcd or 0xce, a few shorter, and the
// payload's other 200 bytes after them), with the kernels and with the Go
// loops alone, in ns/id.
func BenchmarkReadIDs(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 256
	var p []byte
	for range n {
		p = appendTokenAnyWidth(p, uint32(rng.IntN(150_000)), 0)
	}
	for range 200 {
		p = append(p, 0xc0) // nil: what follows the ids is not an id
	}
	out := make([]uint32, n)
	for _, kernel := range []bool{true, false} {
		name := map[bool]string{true: "vbmi", false: "go"}[kernel]
		b.Run(name, func(b *testing.B) {
			if kernel && !hasIDVBMI {
				b.Skip("no AVX-512 VBMI")
			}
			on := hasIDVBMI
			hasIDVBMI = kernel
			defer func() { hasIDVBMI = on }()
			for b.Loop() {
				if k, _ := readIDs(out, p, 0); k < n-3 {
					b.Fatalf("read %d of %d ids", k, n)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/id")
		})
	}
}

// runIDs reads the 0xcd/0xce ids from byte i on, up to another header or
// the end of b, one at a time.
func runIDs(b []byte, i int) (ids []uint32) {
	for i < len(b) {
		switch {
		case b[i] == 0xcd && i+3 <= len(b):
			ids = append(ids, uint32(binary.BigEndian.Uint16(b[i+1:])))
			i += 3
		case b[i] == 0xce && i+5 <= len(b):
			ids = append(ids, binary.BigEndian.Uint32(b[i+1:]))
			i += 5
		default:
			return ids
		}
	}
	return ids
}

// goQuadPath is where the Go quad loop stands after each quad it takes
// from id k at byte i: ids and bytes, from the start.
func goQuadPath(n int, b []byte, k, i int) (ks, is []int) {
	out := make([]uint32, n)
	ks, is = []int{k}, []int{i}
	for {
		k2, i2 := goIDQuads(out[:min(n, k+4)], b, k, i)
		if k2 == k {
			return ks, is
		}
		k, i = k2, i2
		ks, is = append(ks, k), append(is, i)
	}
}

// The block kernel stops where the Go loop passes, having put what the
// Go loop puts up to there: for runs of mixed encodings at every offset,
// out of every length and buffers ending mid-element. Past the place it
// returns it writes only the ids the Go loops go on to read (the ids of
// the quad it went back over), and nothing past out.
func TestReadIDBlocksVBMIMatchesGo(t *testing.T) {
	if !hasIDVBMI {
		t.Skip("no AVX-512 VBMI")
	}
	rng := rand.New(rand.NewPCG(19, 6))
	const trials = 40_000
	const sentinel = 0xdeadbeef
	blocks, ended := 0, 0 // trials where it took 64 bytes or more; stopped where the Go loop does
	for trial := range trials {
		b, pre := idRun(rng, trial)
		k0 := rng.IntN(6)
		n := k0 + rng.IntN(210)
		got := make([]uint32, n+40)
		for j := range got {
			got[j] = sentinel
		}
		want := make([]uint32, n)
		wk, wi := goIDQuads(want, b, k0, pre)
		gk, gi := readIDBlocksVBMI(got[:n], b, k0, pre)
		ks, is := goQuadPath(n, b, k0, pre)
		on := false
		for q := range ks {
			on = on || ks[q] == gk && is[q] == gi
		}
		if !on || !slices.Equal(got[k0:gk], want[k0:gk]) {
			t.Fatalf("trial %d (%d bytes from %d, out %d from %d): blocks (%d, %d), not on the Go loop's way to (%d, %d)\ngot  %x\nwant %x\n% x",
				trial, len(b), pre, n, k0, gk, gi, wk, wi, got[k0:gk], want[k0:gk], b)
		}
		ref := runIDs(b, pre)
		for j := gk; j < len(got); j++ {
			if got[j] != sentinel && (j >= min(gk+3, n) || j-k0 >= len(ref) || got[j] != ref[j-k0]) {
				t.Fatalf("trial %d: id %d written (%x) past the blocks' %d (Go loop: %d, out %d)", trial, j, got[j], gk, wk, n)
			}
		}
		if gi-pre >= 64 {
			blocks++
		}
		if gk == wk && gi == wi {
			ended++
		}
	}
	if blocks < trials/4 || ended < trials/2 {
		t.Fatalf("the kernel took a block in %d of %d trials and stopped where the Go loop does in %d: the cases are not mixed", blocks, trials, ended)
	}
}
