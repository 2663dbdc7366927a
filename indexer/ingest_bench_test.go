package indexer

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// BenchmarkFindMatchesDuringIngest measures what ingest does to selection:
// the latency of BenchmarkFindMatches100k's lookup (1,024 workers, a
// 100k-token prompt) while ingesters goroutines decode and apply
// steady-state payloads (BenchmarkDecodeApply's, each for a rank of its
// own) into the same partition as fast as they can, against the same
// lookup with no ingest. It reports the lookup's p50 and p99 and the
// blocks per second ingested meanwhile.
func BenchmarkFindMatchesDuringIngest(b *testing.B) {
	x, prompt := findMatchesFleet(b)
	for _, ingesters := range []int{0, 1, 2} {
		b.Run(fmt.Sprintf("ingesters=%d", ingesters), func(b *testing.B) {
			stop := make(chan struct{})
			var blocks atomic.Int64
			var wg sync.WaitGroup
			for g := range ingesters {
				payloads := steadyPayloads(EncodingArray, 7, uint64(g))
				r := selection.Rank{WorkerID: uint64(5000 + g)}
				wg.Go(func() {
					var d Decoder
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						batch, err := d.Decode(payloads.at(i))
						if err != nil {
							panic(err)
						}
						for k := range batch.Events {
							_ = x.Apply(part, r, &batch.Events[k])
						}
						blocks.Add(blocksPer)
					}
				})
			}
			var m selection.Matches
			var hashes []uint64
			lat := make([]time.Duration, 0, 4096)
			start := time.Now()
			for b.Loop() {
				t0 := time.Now()
				hashes = lookUp(x, prompt, hashes, &m)
				lat = append(lat, time.Since(t0))
			}
			elapsed := time.Since(start)
			close(stop)
			wg.Wait()
			slices.Sort(lat)
			p50, p99 := percentiles(lat)
			b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
			b.ReportMetric(float64(p99.Microseconds()), "p99-µs")
			b.ReportMetric(float64(blocks.Load())/elapsed.Seconds(), "ingest-blocks/s")
			if len(m.List) != 64 {
				b.Fatalf("%d ranks matched, want 64", len(m.List))
			}
		})
	}
}
