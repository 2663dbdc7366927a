package selection

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// BenchmarkApproxRecord books prompts into the approximate index and
// reports, besides the mean, the longest single booking (max-µs): what a
// booking that finds the index full waits for, lookups with it.
//
//   - unbounded, bounded: 64-block prompts that share a 32-block prefix
//     and end in blocks of their own, as a chat's system prompt and
//     conversations do (a split and a new run each time); bounded keeps
//     the index at 8 MiB, so it evicts in its steady state. unbounded is
//     the index as it was before it had a bound.
//   - bounded_single_block: prompts of one block each, in an index bound
//     at 64 MiB: the shape with the most edges a byte (about 300,000).
func BenchmarkApproxRecord(b *testing.B) {
	for _, tc := range []struct {
		name   string
		bound  int64
		blocks int
	}{{"unbounded", 0, 64}, {"bounded", 8 << 20, 64}, {"bounded_single_block", 64 << 20, 1}} {
		b.Run(tc.name, func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 1))
			shared := make([]uint64, tc.blocks/2)
			for i := range shared {
				shared[i] = rng.Uint64()
			}
			prompts := make([][]uint64, 4096)
			for i := range prompts {
				p := append(make([]uint64, 0, tc.blocks), shared...)
				for len(p) < tc.blocks {
					p = append(p, rng.Uint64())
				}
				prompts[i] = p
			}
			ai := NewApproxIndex(time.Hour)
			if tc.bound > 0 {
				ai.SetMaxMemory(tc.bound)
				// Fill it first: the steady state is a full index.
				for i := 0; ai.Room().Evicted == 0; i++ {
					p := prompts[i%len(prompts)]
					p[len(p)-1] = rng.Uint64()
					ai.RecordBooking(PartitionKey{"m", "g"}, Rank{uint64(i % 16), 0}, p)
				}
			}
			k := PartitionKey{"m", "g"}
			var longest time.Duration
			var overMs int
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				p := prompts[i%len(prompts)]
				p[len(p)-1] = uint64(i) // a block no earlier booking had
				start := time.Now()
				ai.RecordBooking(k, Rank{uint64(i % 16), 0}, p)
				d := time.Since(start)
				longest = max(longest, d)
				if d > time.Millisecond {
					overMs++
				}
			}
			b.ReportMetric(float64(longest.Microseconds()), "max-µs")
			b.ReportMetric(float64(overMs), "over-1ms")
		})
	}
}

// BenchmarkApproxLookupManyRanks looks up a 64-block prompt that ranks
// ranks each hold a prefix of (rank i the first 1 + i%64 blocks), so its
// path is 64 edges each held by a share of the ranks: a scan of the
// lookup's list per hold per edge was quadratic in the ranks.
func BenchmarkApproxLookupManyRanks(b *testing.B) {
	for _, ranks := range []int{16, 256, 4096} {
		b.Run(strconv.Itoa(ranks), func(b *testing.B) {
			ai := NewApproxIndex(time.Hour)
			k := PartitionKey{"m", "g"}
			prompt := make([]uint64, 64)
			for i := range prompt {
				prompt[i] = uint64(i) + 1
			}
			for i := range ranks {
				ai.RecordBooking(k, Rank{uint64(i), 0}, prompt[:1+i%64])
			}
			keys := AppendSequenceHashes(nil, prompt)
			var m Matches
			b.ResetTimer()
			for b.Loop() {
				m.List = m.List[:0]
				ai.FindMatchesChain(k, keys, &m)
			}
			if len(m.List) != ranks {
				b.Fatalf("%d matches, want %d", len(m.List), ranks)
			}
		})
	}
}

// BenchmarkApproxRemoveWorker removes a worker from an index filled to 64
// MiB with single-block prompts of 16 ranks (about 300,000 edges): what a
// worker taken out, or deleted, holds every booking and lookup up for.
func BenchmarkApproxRemoveWorker(b *testing.B) {
	ai := NewApproxIndex(time.Hour)
	ai.SetMaxMemory(64 << 20)
	k := PartitionKey{"m", "g"}
	for i := uint64(1); ai.Room().Evicted == 0; i++ {
		ai.RecordBooking(k, Rank{i % 16, 0}, []uint64{i * 0x9e3779b97f4a7c15})
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		ai.RemoveWorker(k, uint64(i%16))
	}
}
