package indexer

import (
	"slices"
	"sync/atomic"
)

// Eviction of the oldest entries once the index holds MaxEntries.
//
// Each tree queues its entries in store order, as 4-byte refs (record.go);
// an entry's eviction stamp lives with it. The head is evicted unless a
// lookup reached its block since it was queued (fUsed): then it is queued
// again at the back, once (second chance, or CLOCK). Plain store order
// evicts a shared system prompt first, since it was stored before the
// sessions that reuse it, and engines never publish a block they hold
// again: every later store under it would then be dropped for its unknown
// parent. Measured on BenchmarkEvictVersusRefuse, plain FIFO kept a 0.15
// hit ratio against 0.61 for refusing new blocks. Entries removed
// otherwise (an engine's BlockRemoved, a cleared rank) are not looked for
// in the queue; their items go stale and are skipped when they reach the
// head, and the queue is compacted when stale items outnumber live ones.
// A ref with a queue item (fQueued) is not reused, not even for a new
// entry of the same record, until the item is popped or compacted away:
// so an item is live exactly while its ref holds an entry, and a hash
// removed and stored again gets a new ref and a new item instead of being
// evicted early by the old one. Across partitions, eviction takes from
// the tree whose head is oldest.

// evictBatch bounds the queue items one eviction pass pops under a tree's
// lock, so lookups are not held up for long.
const evictBatch = 1024

// evictQueue is a tree's FIFO of entry refs; it belongs to the tree's
// lock, except head, which eviction reads across trees.
type evictQueue struct {
	items []uint32
	first int // index of the oldest item not popped
	// head is 1<<32 | the oldest item's stamp, or 0 when the queue is empty.
	head atomic.Uint64
}

func (q *evictQueue) len() int { return len(q.items) - q.first }

// push queues entry e (its stamp set).
func (t *tree) push(e uint32) {
	*t.metaOf(e) |= fQueued
	q := &t.queue
	q.items = append(q.items, e)
	if q.len() == 1 {
		t.setHead()
	}
}

func (t *tree) setHead() {
	q := &t.queue
	if q.first < len(q.items) {
		q.head.Store(1<<32 | uint64(*t.stampOf(q.items[q.first])))
	} else {
		q.head.Store(0)
	}
}

// unqueue clears e's queue mark as its item leaves the queue; it reports
// whether e still holds an entry (the item was live), and frees e's slot
// when it holds nothing.
func (t *tree) unqueue(e uint32) bool {
	p := t.metaOf(e)
	*p &^= fQueued
	if *p&fEntry != 0 {
		return true
	}
	t.reclaim(e)
	return false
}

// evict pops up to evictBatch items while the index is over its bound,
// evicting the entries they stand for; it returns how many it popped.
func (t *tree) evict(x *Index) int {
	q := &t.queue
	popped := 0
	for popped < evictBatch && q.first < len(q.items) && x.entries.Load() > x.MaxEntries {
		e := q.items[q.first]
		q.first++
		popped++
		if !t.unqueue(e) {
			continue
		}
		engine, block, id := t.entryOf(e)
		if bp := &t.recs.at(block).meta; *bp&fUsed != 0 {
			// Looked up since it was queued: a second turn, from the back.
			*bp &^= fUsed
			*t.stampOf(e) = x.stamps.Add(1)
			t.push(e)
			continue
		}
		m := t.ranks[t.rankList[id]]
		m.del(engine)
		x.entries.Add(-1)
		t.live--
		t.noteShrink(id, m)
		t.dropEntry(e)
		x.counters.evicted.add(1)
	}
	t.setHead()
	return popped
}

// compactQueue drops stale items once they outnumber live ones, and the
// popped prefix once it is most of the array, into a right-sized array so
// the old one is released.
func (t *tree) compactQueue() {
	q := &t.queue
	switch n := q.len(); {
	case n == 0 && q.items == nil:
		return
	case t.live == 0 || n == 0:
		for _, e := range q.items[q.first:] {
			t.unqueue(e)
		}
		q.items, q.first = nil, 0
	case n > 2*t.live+evictBatch:
		t.purgeQueue()
	case q.first > evictBatch && q.first > n:
		q.items, q.first = slices.Clone(q.items[q.first:]), 0
	default:
		return
	}
	t.setHead()
}

// purgeQueue keeps the live items only, freeing the slots of stale ones.
func (t *tree) purgeQueue() {
	q := &t.queue
	keep := make([]uint32, 0, t.live+t.live/8)
	for _, e := range q.items[q.first:] {
		if *t.metaOf(e)&fEntry != 0 {
			keep = append(keep, e)
		} else {
			t.unqueue(e)
		}
	}
	q.items, q.first = keep, 0
	t.setHead()
}

// evictOver evicts the oldest entries, over all partitions, until the
// index is back within MaxEntries. It takes one tree's lock at a time and
// must be called with none held.
func (x *Index) evictOver() {
	if x.MaxEntries <= 0 {
		return
	}
	for x.entries.Load() > x.MaxEntries {
		t := x.oldestTree()
		if t == nil {
			return // nothing queued: entries stored before the bound was set
		}
		t.mu.Lock()
		popped := t.evict(x)
		t.tidy()
		t.mu.Unlock()
		if popped == 0 {
			return // another evictor emptied the queue first
		}
	}
}

// oldestTree returns the tree whose queue head is oldest, or nil when no
// queue has items. Stamps wrap at 2^32; ages are taken from the newest
// stamp, so the order holds while the oldest queued item is younger than
// 2^32 stores.
func (x *Index) oldestTree() *tree {
	now := x.stamps.Load()
	var best *tree
	var bestAge uint32
	for _, t := range *x.parts.Load() {
		h := t.queue.head.Load()
		if h == 0 {
			continue
		}
		if age := now - uint32(h); best == nil || age > bestAge {
			best, bestAge = t, age
		}
	}
	return best
}
