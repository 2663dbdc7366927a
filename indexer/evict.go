package indexer

import (
	"slices"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Eviction once the index holds MaxEntries, by share: an entry is evicted
// only from a rank holding more than its share of the bound (MaxEntries
// over the ranks with an engine table, in all partitions). The rank that
// just stored makes room from its own oldest entries when it is over its
// share; otherwise the oldest entries of the ranks over theirs go. One
// oldest-first queue for the whole index let a single publisher's flood
// push every other worker's entries out: the flood's entries were the
// newest, so everybody else's went first (RELIABILITY.md). By share, the
// flood evicts its own entries, and the ranks within their share keep
// what they hold. Once a fleet fills the bound every rank sits near its
// share, and each store evicts the storer's oldest entries, as many as it
// added, without a look at other ranks. When total entries pass the bound
// some rank is over its share, so there is always a rank to take from.
//
// Each rank queues its entries in store order, as 4-byte refs (record.go);
// an entry's eviction stamp lives with it. The head is evicted unless a
// lookup reached its block since it was queued (fUsed): then it is queued
// again at the back, once (second chance, or CLOCK). Plain store order
// evicts a shared system prompt first, since it was stored before the
// sessions that reuse it, and engines never publish a block they hold
// again: every later store under it would then be dropped for its unknown
// parent. Measured on BenchmarkEvictVersusRefuse, plain FIFO kept a 0.15
// hit ratio against 0.61 for refusing new blocks. Entries an engine
// removes are not looked for in the queue; their items go stale and are
// skipped when they reach the head, and the queue is compacted when stale
// items outnumber live ones. A cleared rank's queue goes with it. A ref
// with a queue item (fQueued) is not reused, not even for a new entry of
// the same record, until the item is popped or compacted away: so an item
// is live exactly while its ref holds an entry, and a hash removed and
// stored again gets a new ref and a new item instead of being evicted
// early by the old one.

// evictBatch bounds the queue items one eviction pass pops under a tree's
// lock, so lookups are not held up for long.
const evictBatch = 1024

// evictQueue is one rank's FIFO of entry refs, under its tree's lock.
type evictQueue struct {
	items []uint32
	first int // index of the oldest item not popped
	// compact is set while the rank is on its tree's compact list.
	compact bool
}

func (q *evictQueue) len() int { return len(q.items) - q.first }

// push queues entry e (its stamp set) on rank id's queue.
func (t *tree) push(id uint32, e uint32) {
	*t.metaOf(e) |= fQueued
	t.queues[id].items = append(t.queues[id].items, e)
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

// rankLen is how many entries rank id holds.
func (t *tree) rankLen(id uint32) int {
	if m, ok := t.ranks[t.rankList[id]]; ok {
		return m.Len()
	}
	return 0
}

// evict pops up to evictBatch items of rank id's queue while the index is
// over its bound and the rank over share, evicting the entries they stand
// for; it returns how many it popped.
func (t *tree) evict(x *Index, id uint32, share int64) int {
	q := &t.queues[id]
	m, ok := t.ranks[t.rankList[id]]
	if !ok {
		return 0
	}
	popped := 0
	for popped < evictBatch && q.first < len(q.items) && x.entries.Load() > x.MaxEntries && int64(m.Len()) > share {
		e := q.items[q.first]
		q.first++
		popped++
		if !t.unqueue(e) {
			continue
		}
		engine, block, _ := t.entryOf(e)
		if bp := &t.recs.at(block).meta; *bp&fUsed != 0 {
			// Looked up since it was queued: a second turn, from the back.
			*bp &^= fUsed
			*t.stampOf(e) = x.stamps.Add(1)
			t.push(id, e)
			continue
		}
		m.del(engine)
		x.entries.Add(-1)
		t.live--
		t.noteShrink(id, m)
		t.dropEntry(e)
		x.counters.evicted.add(1)
	}
	t.compactQueue(id)
	return popped
}

// noteStale puts rank id on the compact list once an engine's removal
// leaves its queue with more stale items than live ones, so tidy compacts
// it.
func (t *tree) noteStale(id uint32, m *refTable) {
	if q := &t.queues[id]; !q.compact && q.len() > 2*m.Len()+evictBatch {
		q.compact = true
		t.compact = append(t.compact, id)
	}
}

// compactQueues compacts the queues on the compact list.
func (t *tree) compactQueues() {
	for _, id := range t.compact {
		t.queues[id].compact = false
		t.compactQueue(id)
	}
	t.compact = t.compact[:0]
}

// compactQueue drops rank id's stale items once they outnumber live ones,
// and the popped prefix once it is most of the array, into a right-sized
// array so the old one is released.
func (t *tree) compactQueue(id uint32) {
	q := &t.queues[id]
	switch n, live := q.len(), t.rankLen(id); {
	case n == 0 && q.items == nil:
	case live == 0 || n == 0:
		t.dropQueue(id)
	case n > 2*live+evictBatch:
		t.purgeQueue(id)
	case q.first > evictBatch && q.first > n:
		q.items, q.first = slices.Clone(q.items[q.first:]), 0
	}
}

// dropQueue empties rank id's queue, freeing the slots its items kept.
func (t *tree) dropQueue(id uint32) {
	q := &t.queues[id]
	for _, e := range q.items[q.first:] {
		t.unqueue(e)
	}
	q.items, q.first = nil, 0
}

// purgeQueue keeps rank id's live items only, freeing the slots of stale
// ones.
func (t *tree) purgeQueue(id uint32) {
	q := &t.queues[id]
	keep := make([]uint32, 0, t.rankLen(id)+t.rankLen(id)/8)
	for _, e := range q.items[q.first:] {
		if *t.metaOf(e)&fEntry != 0 {
			keep = append(keep, e)
		} else {
			t.unqueue(e)
		}
	}
	q.items, q.first = keep, 0
}

// purgeQueues purges every rank's queue (before a rebuild renumbers refs).
func (t *tree) purgeQueues() {
	for id := range t.queues {
		if t.queues[id].items != nil {
			t.purgeQueue(uint32(id))
		}
	}
}

// evictOver evicts entries, by share (above), until the index is back
// within MaxEntries. from is the tree whose rank r just stored (nil for
// none): when that rank is over its share, the usual case once a fleet
// fills the bound, it makes room from its own entries, found without a
// look at the other ranks. Otherwise the rank eviction last found over its
// share goes on giving way while it is, and only then are all ranks looked
// at. It takes one tree's lock at a time and must be called with none
// held.
func (x *Index) evictOver(from *tree, r selection.Rank) {
	if x.MaxEntries <= 0 {
		return
	}
	for x.entries.Load() > x.MaxEntries {
		share := x.MaxEntries / max(1, x.rankTables.Load())
		if from != nil && from.evictRank(x, r, share) > 0 {
			continue
		}
		if v := x.victim.Load(); v != nil && v.t.evictID(x, v.id, share) > 0 {
			continue
		}
		v := x.findVictim(share)
		if v == nil {
			return // nothing queued: entries stored before the bound was set
		}
		x.victim.Store(v)
		if v.t.evictID(x, v.id, share) == 0 {
			return // another evictor got there first
		}
	}
}

// victim names a rank to evict from: rank id of tree t.
type victim struct {
	t  *tree
	id uint32
}

// evictRank evicts, under t's lock, from rank r if it is over share.
func (t *tree) evictRank(x *Index, r selection.Rank, share int64) int {
	t.lockWrite()
	defer t.unlockWrite()
	id, ok := t.rankIDs[r]
	if !ok {
		return 0
	}
	popped := t.evict(x, id, share)
	t.tidy()
	return popped
}

// evictID evicts, under t's lock, from rank id if it is over share.
func (t *tree) evictID(x *Index, id uint32, share int64) int {
	t.lockWrite()
	defer t.unlockWrite()
	popped := t.evict(x, id, share)
	t.tidy()
	return popped
}

// findVictim returns, of the ranks holding more than share and with
// entries queued, the one whose oldest queued item is oldest; nil when
// there is none. It takes each tree's read lock in turn. Stamps wrap at
// 2^32; ages are taken from the newest stamp, so the order holds while the
// oldest queued item is younger than 2^32 stores.
func (x *Index) findVictim(share int64) *victim {
	now := x.stamps.Load()
	var best victim
	var bestAge uint32
	for _, t := range *x.parts.Load() {
		t.mu.RLock()
		for _, m := range t.ranks {
			q := &t.queues[m.rank]
			if q.len() == 0 || int64(m.Len()) <= share {
				continue
			}
			if age := now - *t.stampOf(q.items[q.first]); best.t == nil || age > bestAge {
				best, bestAge = victim{t, m.rank}, age
			}
		}
		t.mu.RUnlock()
	}
	if best.t == nil {
		return nil
	}
	return &best
}
