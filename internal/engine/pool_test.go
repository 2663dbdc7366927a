package engine

import (
	"slices"
	"testing"
)

func TestBlockPoolEvictsLeastRecentlyFreed(t *testing.T) {
	p := NewBlockPool(4)
	a := p.Allocate(2, nil)
	if !p.Register(a[0], 10) || !p.Register(a[1], 11) {
		t.Fatal("register failed")
	}
	b := p.Allocate(2, nil)
	p.Register(b[0], 20)
	p.Register(b[1], 21)
	if p.NumFree() != 0 || p.NumCached() != 4 {
		t.Fatalf("free %d cached %d", p.NumFree(), p.NumCached())
	}
	p.Release(a) // freed tail first: 11, then 10
	p.Release(b) // then 21, 20
	if hits, free := p.Match([]uint64{20, 21}, 2); hits != 2 || free != 2 {
		t.Fatalf("match = %d, %d", hits, free)
	}
	// Taking 20 and 21 again keeps them from eviction.
	kept := p.Take([]uint64{20, 21}, 2, nil)
	got := p.Allocate(1, nil)
	if ev := p.TakeEvicted(); !slices.Equal(ev, []uint64{11}) || got[0] != a[1] {
		t.Fatalf("evicted %v (block %d), want 11 first", ev, got[0])
	}
	p.Allocate(1, nil)
	if ev := p.TakeEvicted(); !slices.Equal(ev, []uint64{10}) {
		t.Fatalf("evicted %v, want 10", ev)
	}
	if hits, _ := p.Match([]uint64{10, 11}, 2); hits != 0 {
		t.Fatal("evicted hashes still match")
	}
	p.Release(kept)
	if hits, free := p.Match([]uint64{20, 21, 22}, 3); hits != 2 || free != 2 {
		t.Fatalf("match = %d, %d", hits, free)
	}
}

func TestBlockPoolMatchStopsAtTheFirstMissAndTheLimit(t *testing.T) {
	p := NewBlockPool(8)
	bl := p.Allocate(3, nil)
	for i, h := range []uint64{1, 2, 3} {
		p.Register(bl[i], h)
	}
	if hits, free := p.Match([]uint64{1, 9, 3}, 3); hits != 1 || free != 0 {
		t.Fatalf("match = %d, %d", hits, free)
	}
	if hits, _ := p.Match([]uint64{1, 2, 3}, 2); hits != 2 {
		t.Fatalf("limit ignored: %d", hits)
	}
}

func TestBlockPoolRefusesDuplicateHashes(t *testing.T) {
	p := NewBlockPool(4)
	bl := p.Allocate(2, nil)
	if !p.Register(bl[0], 7) || p.Register(bl[1], 7) {
		t.Fatal("a hash got two blocks")
	}
	p.Release(bl)
	// The duplicate block was never cached, so it is reused without an
	// eviction; the cached one survives.
	p.Allocate(3, nil)
	if ev := p.TakeEvicted(); len(ev) != 0 {
		t.Fatalf("evicted %v", ev)
	}
	if hits, _ := p.Match([]uint64{7}, 1); hits != 1 {
		t.Fatal("cached block lost")
	}
}

func TestBlockPoolClearAndReset(t *testing.T) {
	p := NewBlockPool(4)
	bl := p.Allocate(2, nil)
	p.Register(bl[0], 1)
	p.Register(bl[1], 2)
	p.Clear()
	if p.NumCached() != 0 || p.NumFree() != 2 {
		t.Fatalf("after clear: cached %d free %d", p.NumCached(), p.NumFree())
	}
	p.Release(bl)
	p.Allocate(4, nil)
	if ev := p.TakeEvicted(); len(ev) != 0 {
		t.Fatalf("cleared blocks evicted again: %v", ev)
	}
	p.Reset()
	if p.NumFree() != 4 || p.NumCached() != 0 {
		t.Fatalf("after reset: free %d cached %d", p.NumFree(), p.NumCached())
	}
}

func TestBlockPoolUsesNeverUsedBlocksFirst(t *testing.T) {
	p := NewBlockPool(4)
	a := p.Allocate(2, nil)
	p.Register(a[0], 1)
	p.Register(a[1], 2)
	p.Release(a)
	if p.NumFree() != 4 {
		t.Fatalf("free %d", p.NumFree())
	}
	// Two blocks were never used: they go before any cached block.
	if b := p.Allocate(2, nil); !slices.Equal(b, []int32{2, 3}) || len(p.TakeEvicted()) != 0 {
		t.Fatalf("allocated %v", b)
	}
	p.Allocate(1, nil)
	if ev := p.TakeEvicted(); !slices.Equal(ev, []uint64{2}) {
		t.Fatalf("evicted %v, want the tail block of the freed sequence", ev)
	}
}
