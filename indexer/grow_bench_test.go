package indexer

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// BenchmarkGrowHold: one rank stores 1.5M blocks (chains of 64, block size
// 4), its node and engine tables doubling along the way up to 1.4M keys,
// while a goroutine looks up another rank's prompt in the same partition
// in a loop. It reports the longest lookup (lookup_max_ms) and the
// lookups' p99 (lookup_p99_ms), with tables growing aside (as shipped) and
// in the write lock (every table below growAsideMin, the baseline), and
// the stores' time (store_s).
func BenchmarkGrowHold(b *testing.B) {
	for _, how := range []string{"in_lock", "aside"} {
		b.Run(how, func(b *testing.B) {
			defer func(was int) { growAsideMin = was }(growAsideMin)
			if how == "in_lock" {
				growAsideMin = math.MaxInt
			}
			var worst, p99, took time.Duration
			for b.Loop() {
				x := New()
				x.ConfigurePartition(part, 4, false)
				other := selection.Rank{WorkerID: 2}
				prompt := make([]uint32, 64*4)
				for i := range prompt {
					prompt[i] = 1<<31 + uint32(i)
				}
				ev := &Event{Kind: Stored, BlockSize: 4, TokenIDs: prompt, BlockHashes: make([]uint64, 64)}
				for i := range ev.BlockHashes {
					ev.BlockHashes[i] = 1<<62 + uint64(i)
				}
				if err := x.Apply(part, other, ev); err != nil {
					b.Fatal(err)
				}
				var stop atomic.Bool
				var waits []time.Duration
				var wg sync.WaitGroup
				wg.Go(func() {
					for !stop.Load() {
						start := time.Now()
						depthAt(x, part, 4, other, prompt)
						waits = append(waits, time.Since(start))
					}
				})
				start := time.Now()
				storeChains(b, x, selection.Rank{WorkerID: 1}, 1_500_000/64)
				took = time.Since(start)
				stop.Store(true)
				wg.Wait()
				slices.Sort(waits)
				worst, p99 = waits[len(waits)-1], waits[len(waits)*99/100]
				if n := x.tree(part).nodes.Len(); n < 1_400_000 {
					b.Fatalf("%d keys in the node table", n)
				}
			}
			b.ReportMetric(float64(worst.Microseconds())/1000, "lookup_max_ms")
			b.ReportMetric(float64(p99.Microseconds())/1000, "lookup_p99_ms")
			b.ReportMetric(took.Seconds(), "store_s")
		})
	}
}
