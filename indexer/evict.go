package indexer

import (
	"slices"
	"sync/atomic"
)

// Eviction of the oldest entries once the index holds MaxEntries.
//
// Each tree queues its entries in store order: (engine hash, rank id,
// stamp). The head is evicted unless a lookup reached its block since it
// was queued (node.used): then it is queued again at the back, once
// (second chance, or CLOCK). Plain store order evicts a shared system
// prompt first, since it was stored before the sessions that reuse it,
// and engines never publish a block they hold again: every later store
// under it would then be dropped for its unknown parent. Measured on
// BenchmarkEvictVersusRefuse, plain FIFO kept a 0.15 hit ratio against
// 0.61 for refusing new blocks. Entries removed otherwise (an engine's BlockRemoved, a cleared
// rank) are not looked for in the queue; their items go stale and are
// skipped when they reach the head, and the queue is compacted when stale
// items outnumber live ones. An item is live while its rank's table holds
// its engine hash with the same stamp: a hash removed and stored again
// gets a new stamp and a new item, so the old item does not evict the new
// entry early. Across partitions, eviction takes from the tree whose head
// is oldest.

// stampMask keeps the stamp bits an entry has room for.
const stampMask = 1<<24 - 1

// evictBatch bounds the queue items one eviction pass pops under a tree's
// lock, so lookups are not held up for long.
const evictBatch = 1024

// qitem is one queued entry.
type qitem struct {
	engine uint64
	id     uint32 // tree.rankIDs of the rank
	stamp  uint32
}

// evictQueue is a tree's FIFO of entries; it belongs to the tree's lock,
// except head, which eviction reads across trees.
type evictQueue struct {
	items []qitem
	first int // index of the oldest item not popped
	// head is 1<<32 | the oldest item's stamp, or 0 when the queue is empty.
	head atomic.Uint64
}

func (q *evictQueue) len() int { return len(q.items) - q.first }

func (q *evictQueue) push(it qitem) {
	q.items = append(q.items, it)
	if q.len() == 1 {
		q.setHead()
	}
}

func (q *evictQueue) setHead() {
	if q.first < len(q.items) {
		q.head.Store(1<<32 | uint64(q.items[q.first].stamp))
	} else {
		q.head.Store(0)
	}
}

// itemEntry returns the entry a queued item stands for, with its rank's
// map; ok is false for a stale item.
func (t *tree) itemEntry(it qitem) (e entry, m *table[entry], ok bool) {
	if int(it.id) >= len(t.rankList) {
		return entry{}, nil, false
	}
	m = t.ranks[t.rankList[it.id]]
	e, ok = m.get(it.engine)
	return e, m, ok && e.stamp() == it.stamp&stampMask
}

// evict pops up to evictBatch items while the index is over its bound,
// evicting the entries they stand for; it returns how many it popped.
func (t *tree) evict(x *Index) int {
	q := &t.queue
	popped := 0
	for popped < evictBatch && q.first < len(q.items) && x.entries.Load() > x.MaxEntries {
		it := q.items[q.first]
		q.first++
		popped++
		e, m, ok := t.itemEntry(it)
		if !ok {
			continue
		}
		if n, _ := t.nodes.get(e.key); n != nil && n.used.Load() {
			// Looked up since it was queued: a second turn, from the back.
			n.used.Store(false)
			st := x.stamps.Add(1)
			e.meta = uint32(e.tier()) | st<<8
			m.set(it.engine, e)
			q.items = append(q.items, qitem{engine: it.engine, id: it.id, stamp: st})
			continue
		}
		m.del(it.engine)
		x.entries.Add(-1)
		t.live--
		t.noteShrink(it.id, m)
		t.unhold(it.id, e)
		x.counters.evicted.add(1)
	}
	q.setHead()
	return popped
}

// compactQueue drops stale items once they outnumber live ones, and the
// popped prefix once it is most of the array, into a right-sized array so
// the old one is released.
func (t *tree) compactQueue() {
	q := &t.queue
	switch n := q.len(); {
	case t.live == 0 || n == 0:
		q.items, q.first = nil, 0
	case n > 2*t.live+evictBatch:
		keep := make([]qitem, 0, t.live+t.live/8)
		for _, it := range q.items[q.first:] {
			if _, _, ok := t.itemEntry(it); ok {
				keep = append(keep, it)
			}
		}
		q.items, q.first = keep, 0
	case q.first > evictBatch && q.first > n:
		q.items, q.first = slices.Clone(q.items[q.first:]), 0
	default:
		return
	}
	q.setHead()
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
	x.mu.RLock()
	defer x.mu.RUnlock()
	var best *tree
	var bestAge uint32
	for _, t := range x.parts {
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
