package indexer

import (
	"runtime/debug"
	"sync/atomic"
	"time"
)

// Handing memory back once a large part of the index is gone. The tables
// (reftable.go) never shrink by themselves and freed records stay in their
// pages (on the slab's free list), so a publisher that stored millions of
// blocks kept their memory after its worker was deleted; and even freed
// heap stays mapped until the runtime's scavenger gets to it.

// BytesPerEntry is the heap one (block, rank) entry costs in the dearest
// case, measured by BenchmarkIndexMemory: 61–63 bytes with one rank per
// block at 1M, 4M and 16M entries (each entry its own 40-byte record), 50
// with 16 ranks holding each block, and 77 when a publisher floods the
// index with five times its bound (the eviction queue's stale refs count
// too). Where the tables stand in their growth moves the first figure:
// just after both double (7/16 full) it is about 70 by their sizes (40 +
// 2 × (64/12)/0.4375 + a queue ref and its slack), and a flood's stale refs
// add up to twice that ref again. 96 covers that, rounded up.
const BytesPerEntry = 96

// gcHeadroom is how much more than the index's live heap the process
// holds for it. The Go collector lets the heap grow to twice what is live
// before it collects, and the runtime keeps freed spans for reuse before
// it hands them back, so under churn (a publisher flooding the index past
// its bound, make hostile) the gateway's RSS grew by 2.6–3 times the
// index's live heap; at twice, the flood overran its budget by 16 MB. A
// budget is for what the index makes the process hold, so it pays for all
// of it.
const gcHeadroom = 3

// EntriesForMemory turns a memory budget in bytes into a MaxEntries: how
// many (block, rank) entries fit in it at BytesPerEntry, with the
// collector's headroom. A budget of 0 or less gives 0 (no bound); a
// positive one at least 1.
func EntriesForMemory(bytes int64) int64 {
	if bytes <= 0 {
		return 0
	}
	return max(1, bytes/(BytesPerEntry*gcHeadroom))
}

// LiveHeapForMemory is the live heap a memory budget in bytes leaves an
// index, with the collector's headroom taken off: the approximate index's
// bound (selection.ApproxIndex.SetMaxMemory) when the router runs without
// KV events. A budget of 0 or less gives 0 (no bound).
func LiveHeapForMemory(bytes int64) int64 {
	if bytes <= 0 {
		return 0
	}
	return max(1, bytes/gcHeadroom)
}

// rebuildMin is the size below which a table or slab is not worth
// rebuilding: small ones cost little.
const rebuildMin = 4096

// shrinkFactor is how far below its peak a table or slab must fall
// before it is rebuilt. An engine's steady state (as many blocks removed
// as stored) swings the index's size by up to about half; rebuilding at
// half would copy the maps over and over there (it made the steady-state
// ingest 1.5 times slower), at a quarter the removals that made a rebuild
// necessary pay for it several times over.
const shrinkFactor = 4

// releaseMin is how many entries must have been dropped in bulk (cleared
// ranks, removed workers) before the heap is handed back to the OS, and
// releaseEvery how often at most: debug.FreeOSMemory runs a full GC.
const (
	releaseMin   = 1_000_000
	releaseEvery = 10 * time.Second
)

// tidy returns memory after removals: it compacts the eviction queue,
// rebuilds the node table when it holds a quarter of its peak or less,
// moves the live records (and further holders) to fresh pages when a
// quarter of their slab's peak or less is live, drops it all when the tree
// is empty, and rebuilds rank tables that lost three quarters of their
// entries. So what a tree keeps stays within about four times what it
// holds. It runs under the tree's write lock; its cost is paid for by the
// removals that made it necessary.
func (t *tree) tidy() {
	t.compactQueues()
	if t.clears != nil {
		// A detached rank's table and items name records and exts by
		// index: nothing may move them until they are dropped, and
		// drainClears tidies once they are.
		return
	}
	switch n := t.nodes.Len(); {
	case n == 0 && t.live == 0 && (t.nodesPeak > 0 || t.recs.pages != nil || t.exts.pages != nil):
		clear(t.queues)
		t.recs, t.exts, t.sets = slab[record]{}, slab[ext]{}, slab[holderSet]{}
		t.salts = nil
		t.nodes = newRefTable(0, t, false)
		t.nodesPeak = 0
	case t.nodesPeak >= rebuildMin && n <= t.nodesPeak/shrinkFactor:
		t.nodes = t.nodes.rebuilt()
		t.nodesPeak = n
	}
	if t.recs.peak >= rebuildMin && t.recs.used <= t.recs.peak/shrinkFactor {
		t.rebuildRecords()
	}
	if t.exts.peak >= rebuildMin && t.exts.used <= t.exts.peak/shrinkFactor {
		t.rebuildExts()
	}
	if t.sets.peak >= rebuildMin && t.sets.used <= t.sets.peak/shrinkFactor {
		t.rebuildSets()
	}
	for _, id := range t.shrink {
		r := t.rankList[id]
		m, ok := t.ranks[r]
		if !ok || m.Len() > t.rankPeaks[id]/shrinkFactor {
			continue // cleared, or grown again
		}
		t.ranks[r] = m.rebuilt()
		t.rankPeaks[id] = m.Len()
	}
	t.shrink = t.shrink[:0]
}

// noteShrink marks rank id's table m for a rebuild (by tidy) when a
// removal just brought it to a quarter of its peak. Removals go one at a
// time, so the size passes that mark once.
func (t *tree) noteShrink(id uint32, m *refTable) {
	if peak := t.rankPeaks[id]; peak >= rebuildMin && m.Len() == peak/shrinkFactor {
		t.shrink = append(t.shrink, id)
	}
}

// rebuildRecords moves the live records into fresh, dense pages and
// rewrites every index that names one: the node table, parents, further
// holders, rank tables and the queue. Stale queue items
// go first, so no dead record is kept for them.
func (t *tree) rebuildRecords() {
	t.purgeQueues()
	old := t.recs
	var fresh slab[record]
	remap := make([]uint32, old.next)
	t.nodes.renumber(func(rec uint32) uint32 {
		n := fresh.alloc()
		*fresh.at(n) = *old.at(rec)
		remap[rec] = n
		return n
	})
	fresh.each(func(_ uint32, r *record) {
		if r.parent < uint32(len(remap)) {
			r.parent = remap[r.parent] // 0 when the parent is gone
		} else {
			r.parent = 0
		}
	})
	t.exts.each(func(_ uint32, e *ext) {
		if e.meta&(fHolder|fEntry) != 0 {
			e.block = remap[e.block]
		}
	})
	renumber := func(ref uint32) uint32 {
		if ref&extBit != 0 {
			return ref
		}
		return remap[ref]
	}
	t.renumberRefs(renumber)
	t.recs = fresh
}

// renumberRefs rewrites the refs the rank tables and the queue hold after a
// rebuild moved what they name.
func (t *tree) renumberRefs(renumber func(ref uint32) uint32) {
	for _, m := range t.ranks {
		m.renumber(renumber)
	}
	for _, q := range t.queues {
		for i, e := range q.items {
			if i >= q.first {
				q.items[i] = renumber(e)
			}
		}
	}
}

// rebuildExts moves the live further holders and entries into fresh,
// dense pages and rewrites the holder sets, rank tables and queue.
func (t *tree) rebuildExts() {
	t.purgeQueues()
	old := t.exts
	var fresh slab[ext]
	remap := make([]uint32, old.next)
	old.each(func(i uint32, e *ext) {
		if e.meta&(fHolder|fEntry) != 0 {
			n := fresh.alloc()
			*fresh.at(n) = *e
			remap[i] = n
		}
	})
	renumber := func(ref uint32) uint32 {
		if ref&extBit == 0 {
			return ref
		}
		return remap[ref&^extBit] | extBit
	}
	t.sets.each(func(_ uint32, s *holderSet) {
		for i, e := range s.more {
			s.more[i] = remap[e]
		}
	})
	t.renumberRefs(renumber)
	t.exts = fresh
}

// rebuildSets moves the live holder sets into fresh, dense pages and
// points their blocks' records at the new indexes.
func (t *tree) rebuildSets() {
	var fresh slab[holderSet]
	t.nodes.each(func(rec uint32) {
		if r := t.recs.at(rec); r.meta&fSet != 0 {
			n := fresh.alloc()
			*fresh.at(n) = *t.sets.at(uint32(r.local))
			r.local = r.local&^(1<<32-1) | uint64(n) // the fingerprint stays
		}
	})
	t.sets = fresh
}

// releasing is set while a goroutine hands memory back; lastRelease is
// when one last started (Unix nanoseconds).
var (
	releasing   atomic.Bool
	lastRelease atomic.Int64
)

// releaseMemory hands the heap back to the OS, in a goroutine, once at
// least releaseMin entries (or a quarter of a smaller bound) were dropped
// in bulk since the last time, and not more often than every
// releaseEvery. Call it with no lock held.
func (x *Index) releaseMemory() {
	threshold := int64(releaseMin)
	if x.MaxEntries > 0 {
		// A bounded index may never hold releaseMin entries; what matters
		// is that a large part of what it can hold is gone.
		threshold = min(threshold, max(x.MaxEntries/4, rebuildMin))
	}
	if int64(x.released.Load()) < threshold {
		return
	}
	now := time.Now().UnixNano()
	if now-lastRelease.Load() < int64(releaseEvery) || !releasing.CompareAndSwap(false, true) {
		return
	}
	lastRelease.Store(now)
	x.released.Store(0)
	go func() {
		defer releasing.Store(false)
		debug.FreeOSMemory()
	}()
}
