package indexer

import (
	"fmt"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// batchBlocks bounds the blocks a batch applies under one hold of a
// partition's write lock (one event may carry more; it is then applied
// alone), so a large payload makes lookups wait for a few tens of
// microseconds of work at a time, not for the whole payload.
const batchBlocks = 512

// ApplyBatch applies a payload's events for rank r of partition p, in
// order, taking the partition's write lock once for each run of events
// that together touch at most batchBlocks blocks, where applying them one
// by one takes it once an event. An engine's steady-state payload is a
// store and a removal: with a fleet's listeners queueing on the same
// lock, every hold saved is a handover saved. It returns how many events
// the index refused (the errors Apply returns).
func (x *Index) ApplyBatch(p selection.PartitionKey, r selection.Rank, events []Event) (refused int) {
	x.applyEvents(p, r, events, func(error) { refused++ })
	return refused
}

// applyEvents is ApplyBatch and Apply: it applies events in order, in runs
// under one hold of the write lock, with stores hashed before the lock
// (see hashed), and calls refuse with the error of each event the index
// refused.
func (x *Index) applyEvents(p selection.PartitionKey, r selection.Rank, events []Event, refuse func(error)) {
	t := x.tree(p)
	if t == nil {
		err := fmt.Errorf("partition %s is not configured", p)
		for range events {
			refuse(err)
		}
		return
	}
	var buf [4]hashed // a payload rarely carries more stores than this
	for len(events) > 0 {
		n, blocks := 0, 0
		hs := buf[:0]
		for n < len(events) && (n == 0 || blocks+len(events[n].BlockHashes) <= batchBlocks) {
			blocks += len(events[n].BlockHashes)
			var h hashed
			if !events[n].Skip {
				h = t.hashStore(&events[n])
			}
			hs = append(hs, h)
			n++
		}
		applied, skipped := 0, 0
		t.lockWrite()
		clears := len(t.clears)
		for i := range n {
			ev := &events[i]
			if ev.Skip || (ev.HasGroup && !t.follows(r, ev)) {
				skipped++
				continue
			}
			if err := t.apply(x, r, ev, hs[i]); err != nil {
				refuse(err)
				continue
			}
			applied++
		}
		t.flushEntries(x)
		t.tidy()
		cleared := len(t.clears) > clears
		t.unlockWrite()
		if cleared {
			x.drainClears(t) // the entries of a rank this run cleared (clear.go)
		}
		// Counted once per hold: each add is an atomic read-modify-write.
		if skipped > 0 {
			x.counters.skipped.add(uint64(skipped))
		}
		if applied > 0 {
			x.counters.applied.add(uint64(applied))
		}
		for _, h := range hs {
			h.release()
		}
		x.evictOver(t, r)
		x.releaseMemory()
		events = events[n:]
	}
}
