package indexer

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// buildIndex stores entries (block, rank) entries with holders ranks per
// block, in chains of 64 blocks (block size 4), under a bound above what
// it stores, so the eviction queue is part of the figure.
func buildIndex(tb testing.TB, entries, holders int) *Index {
	const bs, chain = 4, 64
	x := New()
	x.MaxEntries = int64(2 * entries)
	x.ConfigurePartition(part, bs, false)
	tokens := make([]uint32, chain*bs)
	ev := &Event{Kind: Stored, BlockSize: bs, TokenIDs: tokens, BlockHashes: make([]uint64, chain)}
	for c := range entries / holders / chain {
		for i := range tokens {
			tokens[i] = uint32(c*len(tokens) + i)
		}
		for h := range holders {
			for b := range ev.BlockHashes {
				ev.BlockHashes[b] = uint64(c)<<20 | uint64(b)
			}
			// Spread the chains over 1,024 ranks, several per rank.
			r := selection.Rank{WorkerID: uint64((c*holders + h) % 1024)}
			if holders > 1 {
				r = selection.Rank{WorkerID: uint64(h)}
			}
			if err := x.Apply(part, r, ev); err != nil {
				tb.Fatal(err)
			}
		}
	}
	return x
}

func heapAlloc() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkIndexMemory measures the heap one (block, rank) entry costs,
// eviction queue included: with one rank per block (every entry its own
// node) and with 16 ranks holding each block. BytesPerEntry comes from
// the first, the dearer. Run it with -benchtime=1x: each iteration builds
// an index of about a million entries (seed_like and single_owner, issue
// 15's fleets, INDEX_BENCH_ENTRIES: see benchmarkFleetMemory).
func BenchmarkIndexMemory(b *testing.B) {
	benchmarkFleetMemory(b)
	const entries = 1 << 20
	for _, holders := range []int{1, 16} {
		b.Run(fmt.Sprintf("ranks_per_block=%d", holders), func(b *testing.B) {
			var perEntry float64
			for b.Loop() {
				before := heapAlloc()
				x := buildIndex(b, entries, holders)
				perEntry = float64(heapAlloc()-before) / float64(x.Entries())
				runtime.KeepAlive(x)
			}
			b.ReportMetric(perEntry, "B/entry")
		})
	}
	// A publisher flooding the index with five times its bound, every
	// block its own (as the hostile flood does): the eviction queue's stale
	// items, the maps' tombstones and growth all count.
	b.Run("flood_past_bound", func(b *testing.B) {
		var perEntry float64
		for b.Loop() {
			before := heapAlloc()
			x := floodIndex(b, entries/4, 5)
			perEntry = float64(heapAlloc()-before) / float64(x.Entries())
			runtime.KeepAlive(x)
		}
		b.ReportMetric(perEntry, "B/entry")
	})
}

// floodIndex stores times × bound single-rank entries, in chains of 64
// blocks, into an index bounded to bound entries.
func floodIndex(tb testing.TB, bound, times int) *Index {
	x := New()
	x.MaxEntries = int64(bound)
	x.ConfigurePartition(part, 4, false)
	storeChains(tb, x, selection.Rank{WorkerID: 1}, bound*times/64)
	return x
}

// storeChains stores chains distinct chains of 64 blocks (block size 4)
// for rank r, as an engine stores long prompts.
func storeChains(tb testing.TB, x *Index, r selection.Rank, chains int) {
	const bs, chain = 4, 64
	tokens := make([]uint32, chain*bs)
	ev := &Event{Kind: Stored, BlockSize: bs, TokenIDs: tokens, BlockHashes: make([]uint64, chain)}
	for c := range chains {
		for i := range tokens {
			tokens[i] = uint32(c*len(tokens) + i)
		}
		for b := range ev.BlockHashes {
			ev.BlockHashes[b] = uint64(c)<<20 | uint64(b)
		}
		if err := x.Apply(part, r, ev); err != nil {
			tb.Fatal(err)
		}
	}
}
