package selection

import (
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkApproxRecord books 64-block prompts that share a 32-block
// prefix and end in blocks of their own, as a chat's system prompt and
// conversations do: a split and a new run each time. bounded keeps the
// index at 8 MiB, so it evicts in its steady state; unbounded is the
// index as it was before it had a bound.
func BenchmarkApproxRecord(b *testing.B) {
	for _, tc := range []struct {
		name  string
		bound int64
	}{{"unbounded", 0}, {"bounded", 8 << 20}} {
		b.Run(tc.name, func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 1))
			shared := make([]uint64, 32)
			for i := range shared {
				shared[i] = rng.Uint64()
			}
			prompts := make([][]uint64, 4096)
			for i := range prompts {
				p := append(make([]uint64, 0, 64), shared...)
				for len(p) < 64 {
					p = append(p, rng.Uint64())
				}
				prompts[i] = p
			}
			ai := NewApproxIndex(time.Hour)
			if tc.bound > 0 {
				ai.SetMaxMemory(tc.bound)
			}
			k := PartitionKey{"m", "g"}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				p := prompts[i%len(prompts)]
				p[63] = uint64(i) // a tail no earlier booking had
				ai.RecordBooking(k, Rank{uint64(i % 16), 0}, p)
			}
		})
	}
}
