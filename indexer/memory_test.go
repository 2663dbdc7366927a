package indexer

import (
	"runtime"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestIndexReturnsMemory: a worker stores about a million entries; once
// they are gone (the worker removed, or the engine removing 15 of every
// 16 blocks), the heap in use after a GC is back near where it started:
// rank maps, the node map, slabs, spares and the eviction queue are
// released, not kept for blocks that may never come back.
func TestIndexReturnsMemory(t *testing.T) {
	const bs, chain, chains = 4, 1000, 1000
	for _, tc := range []struct {
		name   string
		remove func(x *Index, r selection.Rank, hashes func(c int) []uint64)
		left   int64 // entries left
	}{
		{"remove worker", func(x *Index, r selection.Rank, _ func(int) []uint64) { x.RemoveWorker(part, r.WorkerID) }, 0},
		{"engine removes most blocks", func(x *Index, r selection.Rank, hashes func(int) []uint64) {
			for c := range chains {
				if c%16 != 0 {
					_ = x.Apply(part, r, &Event{Kind: Removed, BlockHashes: hashes(c)})
				}
			}
		}, chain * ((chains + 15) / 16)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inUse := func() uint64 {
				var ms runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&ms)
				return ms.HeapInuse
			}
			tokens := make([]uint32, chain*bs)
			hashes := func(c int) []uint64 {
				h := make([]uint64, chain)
				for b := range h {
					h[b] = uint64(c)<<20 | uint64(b)
				}
				return h
			}
			base := inUse()
			x := New()
			x.MaxEntries = 1 << 30 // with the eviction queue, which must go too
			x.ConfigurePartition(part, bs, false)
			r := selection.Rank{WorkerID: 3}
			for c := range chains {
				for i := range tokens {
					tokens[i] = uint32(c*len(tokens) + i)
				}
				if err := x.Apply(part, r, &Event{Kind: Stored, BlockSize: bs, TokenIDs: tokens, BlockHashes: hashes(c)}); err != nil {
					t.Fatal(err)
				}
			}
			full := inUse()
			tc.remove(x, r, hashes)
			if x.Entries() != tc.left {
				t.Fatalf("%d entries left, want %d", x.Entries(), tc.left)
			}
			after := inUse()
			runtime.KeepAlive(x)
			grown := full - base
			// What is left holds 1/16 of the entries; a tree keeps up to
			// about four times what it holds (shrinkFactor), so allow six
			// times its share: far below the whole, which it kept before.
			if kept := after - min(after, base); kept > grown*6/16 {
				t.Fatalf("heap in use: %d MB before, %d MB with %d entries, %d MB after removal; %d MB kept",
					base>>20, full>>20, chain*chains, after>>20, kept>>20)
			}
			t.Logf("heap in use: %d MB before, %d MB full, %d MB after", base>>20, full>>20, after>>20)
		})
	}
}

func TestEntriesForMemory(t *testing.T) {
	for _, tc := range []struct {
		budget int64
		want   int64
	}{
		{0, 0},
		{-1, 0},
		{1, 1},
		{BytesPerEntry * gcHeadroom * 1000, 1000},
		// The default budget: the live heap and the collector's headroom
		// above it both fit.
		{2 << 30, (2 << 30) / (BytesPerEntry * gcHeadroom)},
	} {
		if got := EntriesForMemory(tc.budget); got != tc.want {
			t.Errorf("EntriesForMemory(%d) = %d, want %d", tc.budget, got, tc.want)
		}
	}
}

// A bounded index that never holds releaseMin entries still hands its
// memory back once most of what it can hold is dropped (the hostile flood's
// 64 MiB index kept its heap after its worker was deleted).
func TestBoundedIndexReleasesMemory(t *testing.T) {
	lastRelease.Store(0) // no release for releaseEvery yet, as far as this test knows
	x := New()
	x.MaxEntries = 40_000
	x.ConfigurePartition(part, 4, false)
	r := selection.Rank{WorkerID: 1}
	storeChains(t, x, r, 500) // 32,000 entries
	x.RemoveWorker(part, r.WorkerID)
	if lastRelease.Load() == 0 {
		t.Fatalf("dropping %d of a %d-entry bound handed nothing back", 32_000, x.MaxEntries)
	}
	for releasing.Load() {
		time.Sleep(time.Millisecond) // let the release finish before the next test
	}
}
