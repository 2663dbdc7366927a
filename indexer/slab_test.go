package indexer

import (
	"math/rand/v2"
	"testing"
)

// TestSlabReusesFreedIndexes: random allocs and releases, in runs long
// enough to fill and empty several pages of the free list and to
// alternate at a page's edge, never hand out an index twice, reuse freed
// ones before new ones, and keep used and freed right.
func TestSlabReusesFreedIndexes(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	var s slab[uint64]
	out := map[uint32]bool{} // handed out, not released
	var order []uint32
	freed := 0
	for step := range 400 {
		run := rng.IntN(3 * freePage)
		if step%7 == 6 {
			run = 3 // at whatever edge the list stands
		}
		release := rng.IntN(2) == 0 && len(order) > 0
		for range run {
			if release {
				if len(order) == 0 {
					break
				}
				k := rng.IntN(len(order))
				i := order[k]
				order[k] = order[len(order)-1]
				order = order[:len(order)-1]
				delete(out, i)
				s.release(i)
				freed++
				continue
			}
			next := s.next
			i := s.alloc()
			if i == 0 || out[i] {
				t.Fatalf("step %d: index %d handed out twice (or 0)", step, i)
			}
			if freed > 0 {
				if i >= max(next, 1) {
					t.Fatalf("step %d: a new index %d while %d freed ones wait", step, i, freed)
				}
				freed--
			}
			out[i] = true
			order = append(order, i)
		}
		if s.used != len(out) || s.freed() != freed {
			t.Fatalf("step %d: used %d, freed %d; want %d, %d", step, s.used, s.freed(), len(out), freed)
		}
	}
}
