package selection

import (
	"sync"
	"time"
)

// ApproxIndex is Dynamo's approximate mode (use_kv_events false): every
// booked prompt is assumed cached on its rank for a TTL.
//
// It is a compressed prefix trie over the prompt's chain keys (the public
// sequence hashes of its blocks, so a block only matches at the same
// position after the same prefix), with a per-rank expiry on each edge.
// Recording refreshes every edge of the path, so along any path a rank's
// expiry never grows with depth: what a rank still holds is a prefix.
// Recording and lookup cost one sequential comparison per block and a map
// probe per edge.
type ApproxIndex struct {
	ttl time.Duration
	now func() time.Time

	mu        sync.RWMutex
	parts     map[PartitionKey]*approxEdge // roots
	lastSweep time.Time
	room      approxRoom // what it holds against its bound (approx_room.go); under mu
}

type approxEdge struct {
	keys     []uint64 // chain keys of the run's blocks, owned
	locals   []uint64 // their local block hashes, for Dump
	parent   *approxEdge
	children map[uint64]*approxEdge
	holds    []approxHold
}

type approxHold struct {
	rank    Rank
	expires int64 // unix nanoseconds
}

// NewApproxIndex returns an approximate index whose entries live for ttl.
func NewApproxIndex(ttl time.Duration) *ApproxIndex {
	return &ApproxIndex{ttl: ttl, now: time.Now, parts: make(map[PartitionKey]*approxEdge)}
}

// keysPool holds the chain keys of a prompt while a call runs.
var keysPool = sync.Pool{New: func() any { k := make([]uint64, 0, 1024); return &k }}

func (e *approxEdge) hold(r Rank) *approxHold {
	for i := range e.holds {
		if e.holds[i].rank == r {
			return &e.holds[i]
		}
	}
	return nil
}

func (e *approxEdge) child(k uint64) *approxEdge {
	if e.children == nil {
		return nil
	}
	return e.children[k]
}

func (e *approxEdge) addChild(c *approxEdge) {
	if e.children == nil {
		e.children = make(map[uint64]*approxEdge, 1)
	}
	c.parent = e
	e.children[c.keys[0]] = c
}

// split cuts e after k blocks; the tail keeps e's children and holds.
func (e *approxEdge) split(k int) {
	tail := &approxEdge{keys: e.keys[k:], locals: e.locals[k:], children: e.children,
		holds: append([]approxHold(nil), e.holds...)}
	for _, c := range tail.children {
		c.parent = tail
	}
	e.keys, e.locals = e.keys[:k:k], e.locals[:k:k]
	e.children = nil
	e.addChild(tail)
}

// RecordBooking marks blocks as cached on r until the TTL passes.
func (a *ApproxIndex) RecordBooking(p PartitionKey, r Rank, blocks []uint64) {
	if len(blocks) == 0 {
		return
	}
	kp := keysPool.Get().(*[]uint64)
	defer keysPool.Put(kp)
	keys := AppendSequenceHashes((*kp)[:0], blocks)
	*kp = keys
	a.RecordBookingChain(p, r, blocks, keys)
}

// RecordBookingChain implements ChainRecorder.
func (a *ApproxIndex) RecordBookingChain(p PartitionKey, r Rank, blocks, keys []uint64) {
	if len(blocks) == 0 {
		return
	}
	now := a.now()
	exp := now.Add(a.ttl).UnixNano()
	a.mu.Lock()
	defer a.mu.Unlock()
	if now.Sub(a.lastSweep) > a.ttl/4 {
		a.sweepLocked(now.UnixNano())
		a.lastSweep = now
	}
	if !a.roomFor(len(keys), now.UnixNano()) {
		return
	}
	e := a.parts[p]
	if e == nil {
		e = &approxEdge{}
		a.parts[p] = e
		a.room.bytes += approxEdgeBytes
	}
	for pos := 0; pos < len(keys); {
		next := e.child(keys[pos])
		if next == nil {
			// A new run: copy its keys, the pooled buffer is reused.
			next = &approxEdge{keys: append([]uint64(nil), keys[pos:]...), locals: append([]uint64(nil), blocks[pos:]...)}
			e.addChild(next)
			a.room.bytes += edgeCost(len(next.keys), 0)
		}
		m := commonPrefix(next.keys, keys[pos:])
		if m < len(next.keys) {
			next.split(m)
			a.room.bytes += edgeCost(0, len(next.holds))
		}
		if h := next.hold(r); h != nil {
			h.expires = exp
		} else {
			next.holds = append(next.holds, approxHold{rank: r, expires: exp})
			a.room.bytes += approxHoldBytes
		}
		pos += m
		e = next
	}
}

// sweepLocked drops expired holds and the edges left with none.
func (a *ApproxIndex) sweepLocked(now int64) {
	a.pruneLocked(func(h approxHold) bool { return h.expires > now }, now)
}

// pruneLocked keeps the holds keep accepts, drops the edges and roots left
// with none, and takes what they held off the room; holds dropped before
// their expiry (at now) are counted as evicted.
func (a *ApproxIndex) pruneLocked(keep func(approxHold) bool, now int64) {
	for p, root := range a.parts {
		var f freed
		root.prune(keep, now, &f)
		if len(root.children) == 0 {
			delete(a.parts, p)
			f.bytes += approxEdgeBytes
		}
		a.room.bytes -= f.bytes
		a.room.evicted.Add(f.liveBlocks)
	}
}

// prune keeps, below e, the holds keep accepts, and drops the edges left
// with none: a rank's holds form a prefix of every path, so an edge with
// no holds has none below it either. What it drops is added to f.
func (e *approxEdge) prune(keep func(approxHold) bool, now int64, f *freed) {
	for k, c := range e.children {
		live := c.holds[:0]
		for _, h := range c.holds {
			if keep(h) {
				live = append(live, h)
			} else {
				f.hold(h, len(c.keys), now)
			}
		}
		clear(c.holds[len(live):])
		c.holds = live
		if len(live) == 0 {
			delete(e.children, k)
			c.drop(now, f)
			continue
		}
		c.prune(keep, now, f)
	}
}

// FindMatches implements Indexer. Only the device tier is ever populated.
func (a *ApproxIndex) FindMatches(p PartitionKey, blocks []uint64, out *Matches) {
	if len(blocks) == 0 {
		return
	}
	a.mu.RLock()
	root := a.parts[p]
	hit := root != nil && root.child(blocks[0]) != nil // the first chain key is the first block hash
	a.mu.RUnlock()
	if !hit {
		return
	}
	kp := keysPool.Get().(*[]uint64)
	defer keysPool.Put(kp)
	keys := AppendSequenceHashes((*kp)[:0], blocks)
	*kp = keys
	a.FindMatchesChain(p, keys, out)
}

// FindMatchesChain implements ChainIndexer.
func (a *ApproxIndex) FindMatchesChain(p PartitionKey, keys []uint64, out *Matches) {
	if len(keys) == 0 {
		return
	}
	now := a.now().UnixNano()
	a.mu.RLock()
	defer a.mu.RUnlock()
	root := a.parts[p]
	if root == nil {
		return
	}
	start := len(out.List)
	e := root
	for pos := 0; pos < len(keys); {
		next := e.child(keys[pos])
		if next == nil {
			return
		}
		m := commonPrefix(next.keys, keys[pos:])
		for _, h := range next.holds {
			if h.expires <= now {
				continue
			}
			// A rank live here is live on every shallower edge: its
			// entry is already in the list unless this is its first edge.
			found := false
			for i := start; i < len(out.List); i++ {
				if out.List[i].Rank == h.rank {
					out.List[i].Tiers.Device = uint32(pos + m)
					found = true
					break
				}
			}
			if !found {
				out.List = append(out.List, Match{Rank: h.rank, Tiers: Tiers{Device: uint32(pos + m)}})
			}
		}
		if m < len(next.keys) {
			return
		}
		pos += m
		e = next
	}
}

// RemoveWorker implements Indexer.
func (a *ApproxIndex) RemoveWorker(p PartitionKey, workerID uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if root := a.parts[p]; root != nil {
		var f freed
		root.prune(func(h approxHold) bool { return h.rank.WorkerID != workerID }, a.now().UnixNano(), &f)
		// The root stays, empty or not: the sweep drops empty roots.
		a.room.bytes -= f.bytes
	}
}

// Dump implements Indexer: one single-block Stored event per (block, live
// rank), parents first. The chain key stands in for the engine's hash.
func (a *ApproxIndex) Dump(p PartitionKey) []RouterEvent {
	events, _ := a.DumpLimit(p, 0)
	return events
}

// DumpLimit implements DumpLimiter: Dump with at most limit events (limit
// ≤ 0: no limit), in the same breadth-first order, so a truncated dump
// still holds every event's parent.
func (a *ApproxIndex) DumpLimit(p PartitionKey, limit int) (events []RouterEvent, truncated bool) {
	now := a.now().UnixNano()
	a.mu.RLock()
	defer a.mu.RUnlock()
	root := a.parts[p]
	if root == nil {
		return nil, false
	}
	type item struct {
		e      *approxEdge
		parent *uint64
	}
	queue := []item{}
	for _, c := range root.children {
		queue = append(queue, item{c, nil})
	}
	for len(queue) > 0 {
		it := queue[0]
		queue = queue[1:]
		parent := it.parent
		for i, key := range it.e.keys {
			for _, h := range it.e.holds {
				if h.expires <= now {
					continue
				}
				if limit > 0 && len(events) == limit {
					return events, true
				}
				events = append(events, RouterEvent{WorkerID: h.rank.WorkerID, StorageTier: "device",
					Event: KVEvent{EventID: uint64(len(events)), DPRank: h.rank.DPRank,
						Data: StoredData{Stored: StoredEvent{ParentHash: parent,
							Blocks: []StoredBlock{{BlockHash: key, TokensHash: it.e.locals[i]}}}}}})
			}
			k := key
			parent = &k
		}
		for _, c := range it.e.children {
			queue = append(queue, item{c, parent})
		}
	}
	return events, false
}

// Interface guards. Apart from Indexer, the router finds these by type
// assertion, so a changed signature would silently turn a path off
// (learning from bookings, chained lookups, the bounded dump).
var (
	_ Indexer         = (*ApproxIndex)(nil)
	_ BookingRecorder = (*ApproxIndex)(nil)
	_ ChainIndexer    = (*ApproxIndex)(nil)
	_ ChainRecorder   = (*ApproxIndex)(nil)
	_ DumpLimiter     = (*ApproxIndex)(nil)
)
