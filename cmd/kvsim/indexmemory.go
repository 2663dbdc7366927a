package main

import (
	"runtime"

	"github.com/kvrouter/caddy-kvrouter/indexer"
	"github.com/kvrouter/caddy-kvrouter/selection"
)

// indexMemory is what the placement a run left in its index costs on its
// own (--index-memory): the placement is dumped, loaded into a fresh index
// of the same block size, and the heap that adds, measured after a
// collection, is divided by its entries. The run's own index also carries
// the history of its growth (tables sized for their peak), which a
// gateway that has run as long carries too; the fresh one shows the
// layout's cost for that placement, the figure the index benchmarks give
// for theirs.
func indexMemory(x *indexer.Index, part selection.PartitionKey, blockSize int) (entries int64, bytesPerEntry float64, err error) {
	events := x.Dump(part)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fresh := indexer.New()
	fresh.ConfigurePartition(part, blockSize, false)
	if err := fresh.LoadDump(part, events); err != nil {
		return 0, 0, err
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	entries = fresh.Entries()
	runtime.KeepAlive(fresh)
	runtime.KeepAlive(events)
	if entries == 0 {
		return 0, 0, nil
	}
	return entries, float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(entries), nil
}
