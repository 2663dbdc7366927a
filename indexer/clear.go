package indexer

import "github.com/kvrouter/caddy-kvrouter/selection"

// Clearing a rank (an engine's AllBlocksCleared, a publisher's restart, a
// worker deleted) a chunk at a time. Dropping a rank's entries under one
// hold of the write lock stalled every lookup of the model for as long as
// it took: 1.7–2.8 s for a rank of 1.69M blocks (RELIABILITY.md). So the
// rank's table and queue leave the tree at once (detachRank: the rank
// holds nothing from there on, and a store of the rank starts a new
// table), and its entries are dropped afterwards, clearChunk of them under
// each hold (drainClears), with the lock released in between. Until its
// turn, an entry of the cleared rank is still a holder of its blocks, so a
// lookup meanwhile may still count those blocks for the rank; an entry
// the rank stores again in the meantime is a new entry, counted with the
// old one in the block's holder, and outlives the old one's drop.

// clearChunk is how many entries of a cleared rank one hold of the write
// lock drops, as many as an eviction batch pops: a lookup arriving during
// a chunk waited 0.3–0.5 ms at the p99 in BenchmarkClearHold.
const clearChunk = 1024

// clearing is a detached rank's table and queue items, to be dropped.
type clearing struct {
	table  *refTable
	items  []uint32 // the rank's queue items when it was detached
	bucket int      // the table's buckets before this one are dropped
}

// detachRank takes rank r's table and queue out of the tree and queues
// them for dropping (drainClears); it runs under the write lock.
func (t *tree) detachRank(x *Index, r selection.Rank) {
	m, ok := t.ranks[r]
	if !ok {
		// Nothing held, but the rank may have learned its group from a
		// store that was then refused (an unknown parent): a restarted
		// engine names its groups again all the same.
		if id, known := t.rankIDs[r]; known {
			t.groups[id] = 0
		}
		return
	}
	id := m.rank
	q := &t.queues[id]
	t.clears = append(t.clears, &clearing{table: m, items: q.items[q.first:]})
	q.items, q.first = nil, 0
	t.rankPeaks[id] = 0
	t.groups[id] = 0 // a restarted engine names its groups again
	delete(t.ranks, r)
	x.rankTables.Add(-1)
}

// drainClears drops the entries of the tree's detached ranks, clearChunk
// at a time under the write lock, until none is left. It must be called
// with no lock held. Whoever detached a rank drains before returning, so
// that a clear is done when Apply or RemoveRank returns (two draining the
// same tree at once share the work); other writers of the tree go on
// meanwhile without draining.
func (x *Index) drainClears(t *tree) {
	for {
		t.lockWrite()
		left := t.clearSome(x, clearChunk)
		if !left {
			t.tidy()
		}
		t.unlockWrite()
		if !left {
			x.releaseMemory()
			return
		}
	}
}

// clearSome drops up to n queue items and entries of the detached ranks
// and reports whether any are left.
func (t *tree) clearSome(x *Index, n int) bool {
	for n > 0 && len(t.clears) > 0 {
		c := t.clears[0]
		// Queue items first: an entry no item names is dropped and freed
		// in one go (dropEntry's common path).
		k := min(n, len(c.items))
		for _, e := range c.items[:k] {
			t.unqueue(e)
		}
		c.items, n = c.items[k:], n-k
		dropped := 0
		for ; n > 0 && c.bucket < len(c.table.buckets); c.bucket++ {
			refs, held := c.table.buckets[c.bucket].held()
			for _, e := range refs[:held] {
				t.dropEntry(e) // each engine entry holds its blocks once
			}
			dropped += held
			n -= max(held, 1)
		}
		x.entries.Add(-int64(dropped))
		x.released.Add(int64(dropped))
		t.live -= dropped
		if len(c.items) == 0 && c.bucket == len(c.table.buckets) {
			t.clears[0] = nil
			t.clears = t.clears[1:]
		}
	}
	if len(t.clears) == 0 {
		t.clears = nil
		return false
	}
	return true
}
