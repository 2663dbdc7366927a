package indexer

import (
	"math"
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
		m, id := t.ranks[r], t.rankIDs[r] // looked up once per event, not per block
		for _, h := range ev.BlockHashes {
			if !t.remove(x, id, m, h) {
				x.counters.unknownBlock.add(1)
			}
		}
	case Cleared:
		t.clearRank(x, r)
	}
	x.counters.applied.add(1)
	return nil
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
	opt := selection.HashOptions{Seed: selection.SaltedSeed(ev.LoraName, ev.CacheSalt), Eagle: ev.Eagle || t.eagle}
	h.locals = selection.AppendBlockHashes((*h.buf)[:0], ev.TokenIDs, t.blockSize, opt)
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
	if ev.HasParent {
		e, ok := m.get(ev.ParentHash)
		if !ok {
			x.counters.unknownParent.add(1)
			return ErrUnknownParent
		}
		parentKey = e.key
	}
	if !h.ok {
		x.counters.tokenCount.add(1)
		return ErrTokenCount
	}
	if m == nil {
		m = newTable[entry](len(ev.BlockHashes))
		t.ranks[r] = m
	}
	id := t.rankID(r)
	ebs, locals := h.ebs, h.locals
	// Engine block i ends at token (i+1)·ebs; it maps to our last full
	// block ending there (the same block when the sizes agree).
	key, have := parentKey, ev.HasParent
	next := 0 // our blocks chained so far
	var span []*node
	for i, h := range ev.BlockHashes {
		ours := min((i+1)*ebs/t.blockSize, len(locals))
		span = span[:0]
		for ; next < ours; next++ {
			var n *node
			key, n = t.extend(key, have, locals[next])
			have = true
			span = append(span, n)
		}
		if len(span) == 0 {
			continue // the engine block ends inside one of ours: nothing to map yet
		}
		t.hold(x, m, id, span, key, h, ev.Tier)
	}
	return nil
}

// hold records that the rank (id, engine map m) holds the blocks of span,
// the last of which is key, under the engine hash engine.
func (t *tree) hold(x *Index, m *table[entry], id uint32, span []*node, key, engine uint64, tier Tier) {
	slot, held := m.upsert(engine)
	if held {
		if e := slot; e.key == key && e.tier() == tier && e.refs < math.MaxUint16 {
			e.refs++ // the engine stored the same block twice
		}
		// Otherwise the engine reused the hash for another block before
		// removing the first; the first mapping stands until it is removed.
		t.dropEmpty(span)
		return
	}
	e := entry{key: key, meta: uint32(tier), refs: 1, span: uint16(len(span))}
	if x.MaxEntries > 0 {
		if x.entries.Load() >= x.MaxEntries {
			x.counters.full.add(1) // stored all the same: Apply evicts the oldest once the lock is released
		}
		st := x.stamps.Add(1)
		e.meta |= st << 8
		t.queue.push(qitem{engine: engine, id: id, stamp: st})
	}
	x.entries.Add(1)
	t.live++
	*slot = e
	if id := int(id); m.Len() > t.rankPeaks[id] {
		t.rankPeaks[id] = m.Len()
	}
	for _, n := range span {
		if h := n.find(id, tier); h != nil {
			h.refs++
			continue
		}
		h := holder{engine: engine, id: id, refs: 1, tier: tier, used: true}
		if !n.first.used {
			n.first = h
		} else {
			if n.more == nil {
				n.more = new([]holder)
			}
			*n.more = append(*n.more, h)
		}
		n.fp ^= mixHolder(id, tier)
		n.nh++
	}
}

// dropEmpty frees the nodes of span that nobody holds (created for a store
// that was then refused).
func (t *tree) dropEmpty(span []*node) {
	for _, n := range span {
		if !n.first.used && len(n.extra()) == 0 {
			key := n.local
			if !n.root {
				key = selection.NextSequenceHash(n.parent, n.local)
			}
			t.freeNode(key, n)
		}
	}
}

// remove drops one reference of an engine hash of rank id (whose map is
// m); false if unknown.
func (t *tree) remove(x *Index, id uint32, m *table[entry], engine uint64) bool {
	p := m.ptr(engine)
	if p == nil {
		return false
	}
	if p.refs--; p.refs > 0 {
		return true
	}
	e := *p
	m.del(engine)
	x.entries.Add(-1)
	t.live--
	t.noteShrink(id, m)
	t.unhold(id, e)
	return true
}

// unhold releases the blocks of an engine entry: its block and the span-1
// before it.
func (t *tree) unhold(id uint32, e entry) {
	key := e.key
	for range max(e.span, 1) {
		n, _ := t.nodes.get(key)
		if n == nil {
			return
		}
		parent := n.parent
		if h := n.find(id, e.tier()); h != nil {
			if h.refs--; h.refs == 0 {
				n.fp ^= mixHolder(id, e.tier())
				n.nh--
				if n.drop(h) {
					t.freeNode(key, n)
				}
			}
		}
		key = parent
	}
}

// clearRank drops every entry of rank r and the rank's table itself (an
// emptied table keeps its slots).
func (t *tree) clearRank(x *Index, r selection.Rank) {
	m, ok := t.ranks[r]
	if !ok {
		return
	}
	id := t.rankIDs[r]
	for _, e := range m.All() {
		t.unhold(id, e) // each engine entry holds its blocks once
	}
	x.entries.Add(-int64(m.Len()))
	x.released.Add(int64(m.Len()))
	t.live -= m.Len()
	t.rankPeaks[id] = 0
	delete(t.ranks, r)
}

// RemoveRank drops every block of one rank (a publisher restart).
func (x *Index) RemoveRank(p selection.PartitionKey, r selection.Rank) {
	if t := x.tree(p); t != nil {
		t.mu.Lock()
		t.clearRank(x, r)
		t.tidy()
		t.mu.Unlock()
		x.releaseMemory()
	}
}

// RemoveWorker implements selection.Indexer.
func (x *Index) RemoveWorker(p selection.PartitionKey, workerID uint64) {
	t := x.tree(p)
	if t == nil {
		return
	}
	t.mu.Lock()
	for r := range t.ranks {
		if r.WorkerID == workerID {
			t.clearRank(x, r)
		}
	}
	t.tidy()
	t.mu.Unlock()
	x.releaseMemory()
}
