package indexer

import (
	"math/rand/v2"
	"os"
	"runtime"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// The steady-state payloads of the benchmarks: each stores blocksPer new
// blocks (block size 16) and removes those stored window payloads earlier,
// round a cycle of nPayloads.
const nPayloads, blocksPer, window = 2048, 16, 512

// steadyPayloads is the benchmarks' engine in its steady state.
func steadyPayloads(enc Encoding, seed1, seed2 uint64) steady[[]byte] {
	return steadyCycle(enc, rand.New(rand.NewPCG(seed1, seed2)), nPayloads, window, blocksPer)
}

// steady is an engine's steady state as payloads (T is []byte), or as
// what is made of them: payload i stores new blocks (blocksPer, unless
// the cycle was built with another count) and removes those stored win
// payloads earlier. They go round a cycle, so every lap repeats with
// each removal known and the rank holding win payloads' blocks
// throughout; only the first lap's first win payloads (its opening)
// store with nothing yet to remove.
type steady[T any] struct {
	cycle, opening []T
}

// at returns the payload with sequence number seq (from 0).
func (s steady[T]) at(seq int) T {
	if seq < len(s.opening) {
		return s.opening[seq]
	}
	return s.cycle[seq%len(s.cycle)]
}

// mapSteady returns f of each of s's payloads, in the same places.
func mapSteady[T, U any](s steady[T], f func(T) U) steady[U] {
	var out steady[U]
	for _, p := range s.cycle {
		out.cycle = append(out.cycle, f(p))
	}
	for _, p := range s.opening {
		out.opening = append(out.opening, f(p))
	}
	return out
}

// steadyCycle builds a steady state of n payloads (n > win) of blocks
// blocks each in encoding enc, its blocks and tokens drawn from rng.
func steadyCycle(enc Encoding, rng *rand.Rand, n, win, blocks int) steady[[]byte] {
	stored := make([]*StoredBlocks, n)
	for i := range stored {
		ev := &StoredBlocks{BlockSize: 16}
		for range blocks {
			ev.BlockHashes = append(ev.BlockHashes, rng.Uint64())
		}
		for range blocks * 16 {
			ev.TokenIDs = append(ev.TokenIDs, uint32(rng.IntN(150000)))
		}
		stored[i] = ev
	}
	var s steady[[]byte]
	for i := range n {
		old := stored[(i+n-win)%n].BlockHashes
		s.cycle = append(s.cycle, AppendBatch(nil, enc, 1, 0, stored[i], Removal{BlockHashes: old}))
	}
	for i := range win {
		s.opening = append(s.opening, AppendBatch(nil, enc, 1, 0, stored[i]))
	}
	return s
}

// BenchmarkDecodeApply measures an engine's steady state: each payload
// stores 16 new blocks (block size 16) and removes the 16 stored 512
// payloads earlier, as a cache that evicts its oldest blocks does; so the
// index holds 8k blocks throughout. ns/block is per stored block, its
// removal included. (Until 2026-12-01 the payloads were not a cycle: a
// quarter of each lap stored with nothing to remove and a quarter stored
// blocks still held, so the index swung between 8k and 16k blocks and a
// block cost 10-15 % less than in the steady state; BENCHMARKS.md.)
func BenchmarkDecodeApply(b *testing.B) {
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		name := map[Encoding]string{EncodingMap: "map", EncodingArray: "array"}[enc]
		b.Run(name, func(b *testing.B) {
			x := New()
			x.ConfigurePartition(part, 16, false)
			payloads := steadyPayloads(enc, 1, 2)
			var d Decoder
			r := selection.Rank{WorkerID: 1}
			b.ReportAllocs()
			cpu := startCPU(b)
			i := 0
			for b.Loop() {
				batch, err := d.Decode(payloads.at(i))
				if err != nil {
					b.Fatal(err)
				}
				for k := range batch.Events {
					_ = x.Apply(part, r, &batch.Events[k])
				}
				i++
			}
			b.ReportMetric(cpu.per(b.N*blocksPer), "cpu-ns/block")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*blocksPer), "ns/block")
			b.ReportMetric(float64(x.Entries()), "entries")
		})
	}
}

// findMatchesFleet builds BenchmarkFindMatches100k's index: 1,024
// workers, 64 of them holding a 16k-token shared prefix and 8 of those the
// prompt's first 32k tokens, the rest ~975 blocks of their own (about 1M
// entries; with INDEX_BENCH_ENTRIES set, as many as make that many
// entries); it returns the index and the 100k-token prompt.
func findMatchesFleet(b *testing.B) (*Index, []uint32) {
	const bs = 16
	x := New()
	x.ConfigurePartition(part, bs, false)
	rng := rand.New(rand.NewPCG(3, 4))
	random := func(n int) []uint32 {
		t := make([]uint32, n)
		for i := range t {
			t[i] = uint32(rng.IntN(150000))
		}
		return t
	}
	store := func(r selection.Rank, tokens []uint32) {
		ev := &Event{Kind: Stored, BlockSize: bs, TokenIDs: tokens}
		for range len(tokens) / bs {
			ev.BlockHashes = append(ev.BlockHashes, rng.Uint64())
		}
		if err := x.Apply(part, r, ev); err != nil {
			b.Fatal(err)
		}
	}
	ownTokens := 15_600
	if os.Getenv("INDEX_BENCH_ENTRIES") != "" {
		const shared = 8*2000 + 56*1000 // the 64 workers' entries
		ownTokens = (fleetEntries(b) - shared) / 960 * bs
	}
	system := random(16_000)
	prompt := append(append([]uint32{}, system...), random(84_000)...)
	for w := range 1024 {
		r := selection.Rank{WorkerID: uint64(w)}
		switch {
		case w < 8:
			store(r, prompt[:32_000])
		case w < 64:
			store(r, system)
		default:
			for own := ownTokens; own > 0; own -= 64 * bs {
				store(r, random(min(own, 64*bs))) // blocks of its own, in prompts of up to 64 blocks
			}
		}
	}
	return x, prompt
}

// BenchmarkFindMatches100k looks up a 100k-token prompt (6,250 blocks)
// against 1,024 workers and about 1M indexed (block, worker) entries; the
// hashing of the prompt is included. 64 workers hold a 16k-token shared
// prefix plus the prompt's first 32k tokens on 8 of them.
func BenchmarkFindMatches100k(b *testing.B) {
	benchmarkFindMatches100k(b, func(x *Index, prompt []uint32, m *selection.Matches, blocks, _ []uint64) ([]uint64, []uint64) {
		return lookUp(x, prompt, blocks, m), nil
	})
}

// BenchmarkFindMatches100kChained is the same lookup as the proxy path
// makes it: block and sequence hashes in one pass (AppendChainedHashes)
// and the walk given the sequence hashes (FindMatchesChain), where the
// benchmark above hashes blocks alone and the walk chains them.
func BenchmarkFindMatches100kChained(b *testing.B) {
	benchmarkFindMatches100k(b, func(x *Index, prompt []uint32, m *selection.Matches, blocks, seqs []uint64) ([]uint64, []uint64) {
		blocks, seqs = selection.AppendChainedHashes(blocks[:0], seqs[:0], prompt, 16, selection.HashOptions{})
		x.FindMatchesChain(part, seqs, m)
		return blocks, seqs
	})
}

// benchmarkFindMatches100k times lookup (hashing the prompt into the
// buffers it is given and returns, then looking it up into m) on the
// fleet of findMatchesFleet.
func benchmarkFindMatches100k(b *testing.B, lookup func(x *Index, prompt []uint32, m *selection.Matches, blocks, seqs []uint64) ([]uint64, []uint64)) {
	x, prompt := findMatchesFleet(b)
	runtime.GC()
	var entries int
	for w := range 1024 {
		entries += x.Blocks(part, selection.Rank{WorkerID: uint64(w)})
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heapPerEntry := float64(ms.HeapAlloc) / float64(entries)
	var m selection.Matches
	var blocks, seqs []uint64
	b.ReportAllocs()
	b.ResetTimer()
	cpu := startCPU(b)
	for b.Loop() {
		m.Reset()
		blocks, seqs = lookup(x, prompt, &m, blocks, seqs)
	}
	b.ReportMetric(cpu.per(b.N), "cpu-ns/op")
	b.ReportMetric(float64(entries), "entries")
	b.ReportMetric(heapPerEntry, "heapB/entry")
	if len(m.List) != 64 {
		b.Fatalf("%d ranks matched, want 64", len(m.List))
	}
}

// BenchmarkDecode is BenchmarkDecodeApply's decoding alone, to tell the
// two halves of its figure apart.
func BenchmarkDecode(b *testing.B) {
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		name := map[Encoding]string{EncodingMap: "map", EncodingArray: "array"}[enc]
		b.Run(name, func(b *testing.B) {
			payloads := steadyPayloads(enc, 1, 2)
			var d Decoder
			b.ReportAllocs()
			cpu := startCPU(b)
			i := 0
			for b.Loop() {
				if _, err := d.Decode(payloads.at(i)); err != nil {
					b.Fatal(err)
				}
				i++
			}
			b.ReportMetric(cpu.per(b.N*blocksPer), "cpu-ns/block")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*blocksPer), "ns/block")
		})
	}
}
