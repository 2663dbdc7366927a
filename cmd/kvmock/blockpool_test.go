package main

import (
	"slices"
	"testing"
)

func TestBlockPoolEvictsLeastRecentlyFreed(t *testing.T) {
	p := newBlockPool(4)
	a := p.allocate(2, nil)
	if !p.register(a[0], 10) || !p.register(a[1], 11) {
		t.Fatal("register failed")
	}
	b := p.allocate(2, nil)
	p.register(b[0], 20)
	p.register(b[1], 21)
	if p.numFree() != 0 || p.numCached() != 4 {
		t.Fatalf("free %d cached %d", p.numFree(), p.numCached())
	}
	p.release(a) // freed tail first: 11, then 10
	p.release(b) // then 21, 20
	if hits, free := p.match([]uint64{20, 21}, 2); hits != 2 || free != 2 {
		t.Fatalf("match = %d, %d", hits, free)
	}
	// Taking 20 and 21 again keeps them from eviction.
	kept := p.take([]uint64{20, 21}, 2, nil)
	got := p.allocate(1, nil)
	if ev := p.takeEvicted(); !slices.Equal(ev, []uint64{11}) || got[0] != a[1] {
		t.Fatalf("evicted %v (block %d), want 11 first", ev, got[0])
	}
	p.allocate(1, nil)
	if ev := p.takeEvicted(); !slices.Equal(ev, []uint64{10}) {
		t.Fatalf("evicted %v, want 10", ev)
	}
	if hits, _ := p.match([]uint64{10, 11}, 2); hits != 0 {
		t.Fatal("evicted hashes still match")
	}
	p.release(kept)
	if hits, free := p.match([]uint64{20, 21, 22}, 3); hits != 2 || free != 2 {
		t.Fatalf("match = %d, %d", hits, free)
	}
}

func TestBlockPoolMatchStopsAtTheFirstMissAndTheLimit(t *testing.T) {
	p := newBlockPool(8)
	bl := p.allocate(3, nil)
	for i, h := range []uint64{1, 2, 3} {
		p.register(bl[i], h)
	}
	if hits, free := p.match([]uint64{1, 9, 3}, 3); hits != 1 || free != 0 {
		t.Fatalf("match = %d, %d", hits, free)
	}
	if hits, _ := p.match([]uint64{1, 2, 3}, 2); hits != 2 {
		t.Fatalf("limit ignored: %d", hits)
	}
}

func TestBlockPoolRefusesDuplicateHashes(t *testing.T) {
	p := newBlockPool(4)
	bl := p.allocate(2, nil)
	if !p.register(bl[0], 7) || p.register(bl[1], 7) {
		t.Fatal("a hash got two blocks")
	}
	p.release(bl)
	// The duplicate block was never cached, so it is reused without an
	// eviction; the cached one survives.
	p.allocate(3, nil)
	if ev := p.takeEvicted(); len(ev) != 0 {
		t.Fatalf("evicted %v", ev)
	}
	if hits, _ := p.match([]uint64{7}, 1); hits != 1 {
		t.Fatal("cached block lost")
	}
}

func TestBlockPoolClearAndReset(t *testing.T) {
	p := newBlockPool(4)
	bl := p.allocate(2, nil)
	p.register(bl[0], 1)
	p.register(bl[1], 2)
	p.clear()
	if p.numCached() != 0 || p.numFree() != 2 {
		t.Fatalf("after clear: cached %d free %d", p.numCached(), p.numFree())
	}
	p.release(bl)
	p.allocate(4, nil)
	if ev := p.takeEvicted(); len(ev) != 0 {
		t.Fatalf("cleared blocks evicted again: %v", ev)
	}
	p.reset()
	if p.numFree() != 4 || p.numCached() != 0 {
		t.Fatalf("after reset: free %d cached %d", p.numFree(), p.numCached())
	}
}

func TestBlockHashesChain(t *testing.T) {
	toks := tokenRange(1, 40)
	h := blockHashes(toks, 16, "")
	if len(h) != 2 || h[0] != blockHash(noneHash, toks[:16]) || h[1] != blockHash(h[0], toks[16:32]) {
		t.Fatalf("hashes %x", h)
	}
	// The same block after a different prefix hashes differently.
	other := append(tokenRange(100, 16), toks[16:32]...)
	if blockHashes(other, 16, "")[1] == h[1] {
		t.Fatal("hash ignores the parent")
	}
}

func TestBlockPoolUsesNeverUsedBlocksFirst(t *testing.T) {
	p := newBlockPool(4)
	a := p.allocate(2, nil)
	p.register(a[0], 1)
	p.register(a[1], 2)
	p.release(a)
	if p.numFree() != 4 {
		t.Fatalf("free %d", p.numFree())
	}
	// Two blocks were never used: they go before any cached block.
	if b := p.allocate(2, nil); !slices.Equal(b, []int32{2, 3}) || len(p.takeEvicted()) != 0 {
		t.Fatalf("allocated %v", b)
	}
	p.allocate(1, nil)
	if ev := p.takeEvicted(); !slices.Equal(ev, []uint64{2}) {
		t.Fatalf("evicted %v, want the tail block of the freed sequence", ev)
	}
}
