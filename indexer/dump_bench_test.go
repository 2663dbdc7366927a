package indexer

import (
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// BenchmarkDumpOrphans times a dump of a partition whose 2M entries none
// can be replayed: a publisher stored 2,000 chains of 1,000 blocks and
// removed the first block of each, so every block's ancestors miss a
// root. The dump emits nothing, but walks nodes under the tree's read
// lock, which holds off writers and the lookups queued behind them: at the
// default cap of 100,000 events, about 400,000 of them (dumpVisitsPerEvent).
func BenchmarkDumpOrphans(b *testing.B) {
	const chains, blocks, bs = 2000, 1000, 4
	x := New()
	x.ConfigurePartition(part, bs, false)
	r := selection.Rank{WorkerID: 1}
	tokens := make([]uint32, blocks*bs)
	for c := range chains {
		ev := &Event{Kind: Stored, BlockSize: bs, TokenIDs: tokens}
		for i := range tokens {
			tokens[i] = uint32(c*len(tokens) + i)
		}
		for k := range blocks {
			ev.BlockHashes = append(ev.BlockHashes, uint64(c)<<32|uint64(k))
		}
		if err := x.Apply(part, r, ev); err != nil {
			b.Fatal(err)
		}
		if err := x.Apply(part, r, &Event{Kind: Removed, BlockHashes: []uint64{uint64(c) << 32}}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(x.Entries()), "entries")
	for b.Loop() {
		if events, _ := x.DumpLimit(part, 100_000); len(events) != 0 {
			b.Fatalf("%d events from orphans", len(events))
		}
	}
}
