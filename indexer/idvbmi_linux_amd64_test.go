package indexer

import (
	"math/rand/v2"
	"slices"
	"syscall"
	"testing"
)

// The kernel reads no byte past the buffer: runs placed to end where an
// unreadable page begins, so that a read past their end faults, decode as
// the Go loop decodes them, for every length up to a few windows.
func TestReadIDQuadsVBMIStopsAtPageEnd(t *testing.T) {
	if !hasIDVBMI {
		t.Skip("no AVX-512 VBMI")
	}
	page := syscall.Getpagesize()
	mem, err := syscall.Mmap(-1, 0, 2*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Skip("no anonymous mapping:", err)
	}
	defer syscall.Munmap(mem)
	if err := syscall.Mprotect(mem[page:], syscall.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(18, 5))
	got, want := make([]uint32, 300), make([]uint32, 300)
	for size := range 400 {
		for range 20 {
			b := mem[page-size : page : page]
			for j := 0; j < size; {
				if rng.IntN(2) == 0 {
					j += copy(b[j:], []byte{0xcd, byte(rng.IntN(256)), byte(rng.IntN(256))})
				} else {
					j += copy(b[j:], []byte{0xce, byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256))})
				}
			}
			i := rng.IntN(min(size, 8) + 1)
			clear(got)
			clear(want)
			gk, gi := readIDQuadsVBMI(got, b, 0, i)
			wk, wi := goIDQuads(want, b, 0, i)
			if gk != wk || gi != wi || !slices.Equal(got, want) {
				t.Fatalf("%d bytes from %d: AVX-512 (%d, %d), Go (%d, %d)", size, i, gk, gi, wk, wi)
			}
		}
	}
}
