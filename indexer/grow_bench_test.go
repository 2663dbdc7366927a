package indexer

import (
	"math"
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
				w := watchLookups(b, x)
				start := time.Now()
				storeChains(b, x, selection.Rank{WorkerID: 1}, 1_500_000/64)
				took = time.Since(start)
				worst, p99 = w.end()
				if n := x.tree(part).nodes.Len(); n < 1_400_000 || w.depth() != 64 {
					b.Fatalf("%d keys in the node table, the other rank's prompt %d blocks", n, w.depth())
				}
			}
			b.ReportMetric(float64(worst.Microseconds())/1000, "lookup_max_ms")
			b.ReportMetric(float64(p99.Microseconds())/1000, "lookup_p99_ms")
			b.ReportMetric(took.Seconds(), "store_s")
		})
	}
}
