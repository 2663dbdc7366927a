package indexer

import (
	"sync"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Applying events to a tree: stores, removals and clears, and dropping a
// rank or a worker.

func (t *tree) apply(x *Index, r selection.Rank, ev *Event, h hashed) error {
	switch ev.Kind {
	case Stored:
		if err := t.store(x, r, ev, h); err != nil {
			return err
		}
	case Removed:
		m := t.ranks[r] // looked up once per event, not per block
		t.removeAll(x, m, ev.BlockHashes)
	case Cleared:
		t.detachRank(x, r) // dropped after the unlock (clear.go)
	}
	return nil
}

// flushEntries adds the entries the events of one hold of the write lock
// stored and removed to the index's count: once per hold, where an atomic
// add per block fenced every block's stores (a store's bound check adds
// the pending delta to the count it reads).
func (t *tree) flushEntries(x *Index) {
	if t.entryDelta != 0 {
		x.entries.Add(t.entryDelta)
		t.entryDelta = 0
	}
}

var localsPool = sync.Pool{New: func() any { s := make([]uint64, 0, 256); return &s }}

// hashed is a store's local block hashes, computed before the tree's
// write lock is taken: hashing is most of a store's CPU, and under the
// lock it serialised every listener of the partition and held up lookups.
type hashed struct {
	locals []uint64  // our blocks' local hashes
	ebs    int       // the engine's block size in tokens
	ok     bool      // false when the tokens do not fill the engine's blocks
	buf    *[]uint64 // localsPool's buffer behind locals
	salt   uint64    // the cache salt's part of the seed (0: unsalted)
}

// hashStore computes ev's local hashes for a tree of block size bs (fixed
// for the tree's life, so no lock is needed to read it). The caller puts
// the result back with release.
func (t *tree) hashStore(ev *Event) hashed {
	if ev.Kind != Stored {
		return hashed{}
	}
	// Engine blocks of ebs tokens (ours when the event gives no size).
	h := hashed{ebs: ev.BlockSize}
	if h.ebs <= 0 {
		h.ebs = t.blockSize
	}
	if len(ev.TokenIDs) != len(ev.BlockHashes)*h.ebs {
		return h // refused under the lock, after the parent check, as before
	}
	h.ok = true
	h.buf = localsPool.Get().(*[]uint64)
	h.salt = selection.SaltPart(ev.CacheSalt)
	h.locals = t.localHashes((*h.buf)[:0], ev, h.ebs, h.salt)
	*h.buf = h.locals
	return h
}

func (h hashed) release() {
	if h.buf != nil {
		localsPool.Put(h.buf)
	}
}

func (t *tree) store(x *Index, r selection.Rank, ev *Event, h hashed) error {
	m := t.ranks[r]
	var parentKey uint64
	var parentRec uint32
	if ev.HasParent {
		e := m.get(ev.ParentHash)
		if e == 0 {
			x.counters.unknownParent.add(1)
			return ErrUnknownParent
		}
		_, parentRec, _ = t.entryOf(e)
		parentKey = t.recs.at(parentRec).key
		h = t.inheritSalt(ev, h, parentKey)
	}
	ebs, locals := h.ebs, h.locals
	if !h.ok {
		x.counters.tokenCount.add(1)
		return ErrTokenCount
	}
	if h.ebs > maxSpan*t.blockSize {
		return ErrBlockSpan
	}
	if t.recs.room() < len(locals) || t.exts.room() < len(locals)+len(ev.BlockHashes) {
		return ErrPartitionFull
	}
	if m == nil {
		m = t.addRank(x, r, len(ev.BlockHashes))
	}
	id := m.rank
	// The blocks' chain keys first (after the locals in the same pooled
	// buffer), then every claim's hash and home bucket, in passes whose
	// loads do not wait on each other (warm.go); the tables make room
	// first, so no claim grows them midway (which would leave what was
	// read ahead behind).
	keys := chainKeys(locals[len(locals):], parentKey, ev.HasParent, locals)
	if h.buf != nil && cap(keys) > cap(*h.buf) {
		*h.buf = keys[:0] // grown: the pool keeps the larger buffer
	}
	t.nodes.reserve(len(keys))
	m.reserve(len(ev.BlockHashes))
	cold := t.cold()
	hashes := t.nodes.hashesOf(t.hashes[:0], keys, cold)
	hashes = m.hashesOf(hashes, ev.BlockHashes, cold)
	if t.hashes = hashes; cap(hashes) > hashesKeep {
		t.hashes = nil // a huge event's scratch is not kept for the next
	}
	nodeHashes, engineHashes := hashes[:len(keys)], hashes[len(keys):]
	// Engine block i ends at token (i+1)·ebs; it maps to our last full
	// block ending there (the same block when the sizes agree).
	rec, have := parentRec, ev.HasParent
	next := 0              // our blocks chained so far
	var spanBuf [16]uint32 // an engine block rarely spans more of ours
	span := spanBuf[:0]
	for i, engine := range ev.BlockHashes {
		ours := min((i+1)*ebs/t.blockSize, len(locals))
		span = span[:0]
		for ; next < ours; next++ {
			rec = t.extend(keys[next], nodeHashes[next], rec, have, locals[next])
			have = true
			span = append(span, rec)
		}
		if len(span) == 0 {
			continue // the engine block ends inside one of ours: nothing to map yet
		}
		t.hold(x, m, id, span, engine, engineHashes[i], ev.Tier)
	}
	t.noteSalted(keys[:next], h.salt)
	return nil
}

// hold records that the rank (id, engine table m) holds the blocks of
// span (record indexes, the last one the engine block's) under the engine
// hash engine, whose hash in m is h.
func (t *tree) hold(x *Index, m *refTable, id uint32, span []uint32, engine, h uint64, tier Tier) {
	last := span[len(span)-1]
	c := m.claimAt(h, engine)
	if c.held {
		p := t.metaOf(c.ref())
		if _, block, _ := t.entryOf(c.ref()); block == last && metaTier(*p) == tier {
			*p = withErefs(*p, erefs(*p)+1) // the engine stored the same block twice
		}
		// Otherwise the engine reused the hash for another block before
		// removing the first; the first mapping stands until it is removed.
		t.dropEmpty(span)
		return
	}
	var e uint32
	if r := t.recs.at(last); len(span) == 1 && r.meta&(fHolder|fEntry|fQueued|fSet) == 0 {
		// Nearly every store of a fleet: one block of ours per engine
		// block, nobody holding it yet. The rank becomes its inline holder
		// and entry in one write, as placeEntry would after a walk.
		r.rank, r.engine = id, engine
		r.meta = r.meta&(fRoot|fUsed) | uint32(tier) | fHolder | 1<<hrefsShift | fEntry | 1<<erefsShift | 1<<spanShift
		e = last
	} else {
		e = t.placeEntry(span, id, tier, engine)
	}
	c.fill(e)
	if x.MaxEntries > 0 {
		if x.entries.Load()+t.entryDelta >= x.MaxEntries {
			x.counters.full.add(1) // stored all the same: Apply evicts by share once the lock is released (evict.go)
		}
		*t.stampOf(e) = x.stamps.Add(1)
		t.push(id, e)
	}
	t.entryDelta++
	t.live++
	if id := int(id); m.Len() > t.rankPeaks[id] {
		t.rankPeaks[id] = m.Len()
	}
}

// placeEntry makes rank id a holder (at tier) of every block of span and
// returns the ref of its new entry under engine, for the last block.
func (t *tree) placeEntry(span []uint32, id uint32, tier Tier, engine uint64) uint32 {
	last := span[len(span)-1]
	var holder uint32
	for _, rec := range span {
		h, ok := t.findHolder(rec, id, tier)
		if ok {
			p := t.metaOf(h)
			*p = withHrefs(*p, hrefs(*p)+1)
		} else {
			h = t.addHolder(rec, id, tier, engine)
		}
		holder = h
	}
	// The entry lives in the last block's holder unless that holder already
	// carries one (or its slot still has a queue item): then in an ext of its own.
	e := holder
	if *t.metaOf(e)&(fEntry|fQueued) != 0 {
		i := t.exts.alloc()
		*t.exts.at(i) = ext{engine: engine, block: last, rank: id, meta: uint32(tier)}
		e = i | extBit
	} else if e&extBit != 0 {
		t.exts.at(e &^ extBit).engine = engine
	} else {
		t.recs.at(e).engine = engine
	}
	p := t.metaOf(e)
	*p = withErefs(*p|fEntry, 1) | uint32(len(span))<<spanShift
	return e
}

// dropEmpty frees the records of span that nobody holds (created for a
// store that was then refused).
func (t *tree) dropEmpty(span []uint32) {
	for _, rec := range span {
		if r := t.recs.at(rec); !alive(r.meta) {
			t.nodes.delRef(r.key, rec)
			t.reclaim(rec)
		}
	}
}

// removeAll removes engine hashes of a rank (whose table is m), in
// order, counting the unknown ones. What the removals read is read ahead
// first, a chunk at a time (readAheadRemoval), and each removal starts
// from where that found its entry.
func (t *tree) removeAll(x *Index, m *refTable, engines []uint64) {
	if m.Len() == 0 {
		x.counters.unknownBlock.add(uint64(len(engines)))
		return
	}
	id := m.rank
	ahead := &t.ahead
	unknown := 0
	for len(engines) > 0 {
		chunk := engines[:min(len(engines), aheadMax)]
		t.readAheadRemoval(m, chunk, ahead)
		for k, engine := range chunk {
			if !t.remove(x, id, m, engine, ahead, k) {
				unknown++
			}
		}
		engines = engines[len(chunk):]
	}
	if unknown > 0 {
		x.counters.unknownBlock.add(uint64(unknown))
	}
}

// remove drops one reference of engine hash engine, the k-th of the chunk
// read ahead into a, of rank id (whose table is m); false if unknown.
func (t *tree) remove(x *Index, id uint32, m *refTable, engine uint64, a *removalAhead, k int) bool {
	// The slot found ahead still holds the entry unless an earlier removal
	// of the chunk removed it (slots do not move): refs are unique in a
	// rank's table.
	i, e, nodeHash := int(a.slot[k]), a.entry[k], a.nodeHash[k]
	if e == 0 || m.refAt(i) != e {
		var held bool
		if i, held = m.findFrom(a.engineHash[k], engine); !held {
			return false
		}
		if f := m.refAt(i); f != e {
			e, nodeHash = f, 0
		}
	}
	if p := t.metaOf(e); erefs(*p) > 1 {
		*p = withErefs(*p, erefs(*p)-1)
		return true
	}
	m.delAt(i, a.engineHash[k]) // one probe for the lookup and the deletion
	t.entryDelta--
	t.live--
	t.noteShrink(id, m)
	t.noteStale(id, m)
	t.dropEntryAt(e, nodeHash)
	return true
}

// dropEntry clears engine entry e (already out of its rank's table) and
// releases the blocks it held: its block and the span-1 before it.
func (t *tree) dropEntry(e uint32) { t.dropEntryAt(e, 0) }

// dropEntryAt is dropEntry with the node-table hash of e's block already
// known (0: not known).
func (t *tree) dropEntryAt(e uint32, nodeHash uint64) {
	if e&extBit == 0 {
		// Nearly every entry of a fleet: inline in its block's record, over
		// that block alone, whose only holder it is (the inline holder, of
		// the entry's rank and tier, with this entry's one reference), and
		// not queued. The block goes with it, as the general path below
		// would find after a walk over holder and flags.
		r := t.recs.at(e)
		if m := r.meta; m&(fSet|fQueued) == 0 && spanOf(m) <= 1 && hrefs(m) == 1 {
			if nodeHash == 0 {
				nodeHash = t.nodes.hashOf(r.key)
			}
			t.nodes.delRefFrom(nodeHash, e)
			r.meta = 0
			t.forgetSalt(r.key)
			t.recs.release(e)
			return
		}
	}
	p := t.metaOf(e)
	tier, span := metaTier(*p), spanOf(*p)
	*p &^= fEntry | countMask<<erefsShift | maxSpan<<spanShift
	_, rec, id := t.entryOf(e)
	if e&extBit != 0 {
		t.reclaim(e) // an entry-only ext
	}
	for k := range max(span, 1) {
		if !alive(t.recs.at(rec).meta) {
			return
		}
		var parent uint32
		if k < span-1 {
			parent = t.parentOf(rec) // before rec may go
		}
		if h, ok := t.findHolder(rec, id, tier); ok {
			hp := t.metaOf(h)
			if n := hrefs(*hp); n > 1 {
				*hp = withHrefs(*hp, n-1)
			} else {
				*hp = withHrefs(*hp, 0)
				t.dropHolder(h)
			}
		}
		if parent == 0 || k == span-1 {
			return
		}
		rec = parent
	}
}

// RemoveRank drops every block of one rank (a publisher restart), a
// chunk at a time (clear.go).
func (x *Index) RemoveRank(p selection.PartitionKey, r selection.Rank) {
	if t := x.tree(p); t != nil {
		t.lockWrite()
		t.detachRank(x, r)
		t.unlockWrite()
		x.drainClears(t)
	}
}

// RemoveWorker implements selection.Indexer, a chunk at a time
// (clear.go).
func (x *Index) RemoveWorker(p selection.PartitionKey, workerID uint64) {
	t := x.tree(p)
	if t == nil {
		return
	}
	t.lockWrite()
	for r := range t.ranks {
		if r.WorkerID == workerID {
			t.detachRank(x, r)
		}
	}
	t.unlockWrite()
	x.drainClears(t)
}
