package indexer

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// BenchmarkClearHold: one rank holding 1M entries (chains of 64 blocks) is
// cleared while a goroutine looks up another rank's prompt in the same
// partition over and over. It reports the longest a lookup took while the
// clear ran (lookup_max_ms, the stall every request for the model saw),
// the lookups' p99 (lookup_p99_ms) and how long the clear took
// (clear_ms): chunked (RemoveRank as shipped) and in one hold of the write
// lock (how clears ran before, the baseline), and for the floor, the same
// lookups over 300 ms without a clear (none: on a shared machine a thread
// is sometimes not run for several milliseconds, lock or no lock).
func BenchmarkClearHold(b *testing.B) {
	const entries = 1 << 20
	for _, how := range []string{"none", "one_hold", "chunked"} {
		b.Run(how, func(b *testing.B) {
			var worst, p99, took time.Duration
			for b.Loop() {
				b.StopTimer()
				x := New()
				x.ConfigurePartition(part, 4, false)
				big, other := selection.Rank{WorkerID: 1}, selection.Rank{WorkerID: 2}
				storeChains(b, x, big, entries/64)
				prompt := make([]uint32, 64*4)
				for i := range prompt {
					prompt[i] = 1<<31 + uint32(i) // no chain of storeChains starts so
				}
				ev := &Event{Kind: Stored, BlockSize: 4, TokenIDs: prompt, BlockHashes: make([]uint64, 64)}
				for i := range ev.BlockHashes {
					ev.BlockHashes[i] = 1<<62 + uint64(i)
				}
				if err := x.Apply(part, other, ev); err != nil {
					b.Fatal(err)
				}
				tr := x.tree(part)
				b.StartTimer()
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
				time.Sleep(5 * time.Millisecond) // the lookups under way
				start := time.Now()
				switch how {
				case "none":
					time.Sleep(300 * time.Millisecond) // what a lookup waits here anyway
				case "chunked":
					x.RemoveRank(part, big)
				default:
					tr.mu.Lock()
					tr.detachRank(x, big)
					tr.clearSome(x, 1<<62)
					tr.tidy()
					tr.mu.Unlock()
				}
				took = time.Since(start)
				stop.Store(true)
				wg.Wait()
				slices.Sort(waits)
				worst, p99 = waits[len(waits)-1], waits[len(waits)*99/100]
				if how != "none" && x.Blocks(part, big) != 0 || depthAt(x, part, 4, other, prompt) != 64 {
					b.Fatalf("after the clear: %d blocks of the cleared rank, the other's prompt %d blocks", x.Blocks(part, big), depthAt(x, part, 4, other, prompt))
				}
			}
			b.ReportMetric(float64(worst.Microseconds())/1000, "lookup_max_ms")
			b.ReportMetric(float64(p99.Microseconds())/1000, "lookup_p99_ms")
			b.ReportMetric(float64(took.Microseconds())/1000, "clear_ms")
		})
	}
}
