package selection

import (
	"maps"
	"slices"
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

	mu       sync.RWMutex
	parts    map[PartitionKey]*approxEdge // roots
	rootKeys map[*approxEdge]PartitionKey // the roots' partitions, to drop an emptied root
	// expiries holds an entry per hold, in the order they were set (a
	// refreshed hold's is queued again when it reaches the front), so
	// about the order they expire: expired and evicted holds are taken
	// from its front without a walk of the trie (approx_expiry.go).
	expiries approxQueue
	room     approxRoom // what it holds against its bound (approx_room.go); under mu
	// removed are the workers removed from each partition in the last
	// TTL, whose older holds no longer count (approx_removed.go).
	removed    removals
	lastForget int64 // when removals were last looked over
}

type approxEdge struct {
	keys     []uint64 // chain keys of the run's blocks, owned
	locals   []uint64 // their local block hashes, for Dump
	parent   *approxEdge
	children map[uint64]*approxEdge
	holds    []approxHold
	// peak is the most children the edge has had since its map was made:
	// a Go map keeps its size when emptied, so one left far below its
	// peak is made again (shrinkChildren).
	peak    int32
	removed bool // cut from the trie: the queue's entries for it are stale
}

type approxHold struct {
	rank    Rank
	expires int64 // unix nanoseconds
}

// NewApproxIndex returns an approximate index whose entries live for ttl.
func NewApproxIndex(ttl time.Duration) *ApproxIndex {
	return &ApproxIndex{ttl: ttl, now: time.Now, parts: make(map[PartitionKey]*approxEdge), rootKeys: make(map[*approxEdge]PartitionKey),
		removed: removals{}}
}

// keysPool holds the chain keys of a prompt while a call runs.
var keysPool = sync.Pool{New: func() any { k := make([]uint64, 0, 1024); return &k }}

func (e *approxEdge) hold(r Rank) *approxHold {
	if i := holdIndex(e, r); i >= 0 {
		return &e.holds[i]
	}
	return nil
}

func (e *approxEdge) child(k uint64) *approxEdge {
	if e.children == nil {
		return nil
	}
	return e.children[k]
}

// addChild puts c under e, counting the map when it makes one.
func (a *ApproxIndex) addChild(e, c *approxEdge) {
	if e.children == nil {
		e.children = make(map[uint64]*approxEdge, 1)
		a.room.bytes += approxMapBytes
	}
	c.parent = e
	e.children[c.keys[0]] = c
	e.peak = max(e.peak, int32(len(e.children)))
}

// shrinkChildren makes e's map again once it holds a quarter of its peak
// or less (and the peak took more than a map's first group), so that a
// prefix that once had many children holds no more than it has now.
func (e *approxEdge) shrinkChildren() {
	if e.peak < 64 || int(e.peak) < 4*len(e.children) {
		return
	}
	// maps.Clone would keep the old map's size: a map made for what is
	// left, and filled, does not.
	fresh := make(map[uint64]*approxEdge, len(e.children))
	maps.Copy(fresh, e.children)
	e.children = fresh
	e.peak = int32(len(e.children))
}

// split cuts e after k blocks and returns the new edge of the first k,
// which takes e's place under its parent with copies of its holds; e
// keeps the rest, its children, and its entries in the expiry queue: the
// deeper edge's holds must not outlive the shallower's (what a rank holds
// is a prefix), and the head's copies, queued now, go after them. Each
// side gets arrays of its own: sharing one, the side that lives on kept
// the other's blocks alive, uncounted (a probe held 10.7 times the
// estimate so, with prompts booked whole once and by their first block
// after).
func (a *ApproxIndex) split(e *approxEdge, k int) *approxEdge {
	head := &approxEdge{keys: slices.Clone(e.keys[:k]), locals: slices.Clone(e.locals[:k]), parent: e.parent,
		holds: append([]approxHold(nil), e.holds...)}
	head.parent.children[head.keys[0]] = head
	e.keys, e.locals = slices.Clone(e.keys[k:]), slices.Clone(e.locals[k:])
	a.addChild(head, e)
	for _, h := range head.holds {
		a.expiries.push(head, h.rank, h.expires)
	}
	a.room.bytes += edgeCost(0, len(head.holds)) + int64(len(head.holds))*approxQueueBytes
	return head
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
	a.mu.Lock()
	defer a.mu.Unlock()
	// The time is read under the lock: a record that waited for it must
	// not stamp holds older than those of the records it waited behind
	// (along a path, expiries must not grow with depth, and the queue is
	// in the order of its stamps).
	now := a.now()
	exp := now.Add(a.ttl).UnixNano()
	a.expireLocked(now.UnixNano())
	if !a.roomFor(len(keys), now.UnixNano()) {
		return
	}
	e := a.parts[p]
	if e == nil {
		e = &approxEdge{}
		a.parts[p] = e
		a.rootKeys[e] = p
		a.room.bytes += approxEdgeBytes
	}
	var onStack [16]*approxEdge
	path := onStack[:0]
	for pos := 0; pos < len(keys); {
		next := e.child(keys[pos])
		if next == nil {
			// A new run: copy its keys, the pooled buffer is reused.
			next = &approxEdge{keys: append([]uint64(nil), keys[pos:]...), locals: append([]uint64(nil), blocks[pos:]...)}
			a.addChild(e, next)
			a.room.bytes += edgeCost(len(next.keys), 0)
		}
		m := commonPrefix(next.keys, keys[pos:])
		if m < len(next.keys) {
			next = a.split(next, m)
		}
		if h := next.hold(r); h != nil {
			// Its queue entry stays where it is, and is queued again
			// with this expiry when the front reaches it.
			h.expires = max(h.expires, exp)
		} else {
			next.holds = append(next.holds, approxHold{rank: r, expires: exp})
			a.room.bytes += approxHoldBytes
			path = append(path, next)
		}
		pos += m
		e = next
	}
	// The new holds, deepest first: within one record, the holds expire
	// together, and an eviction that stops between them must leave a
	// prefix.
	for i := len(path) - 1; i >= 0; i-- {
		a.expiries.push(path[i], r, exp)
	}
	a.room.bytes += int64(len(path)) * approxQueueBytes
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
	rm := a.removed[root]
	var at *rankPositions // built once the first edge has named many ranks
	defer func() { at.put() }()
	e := root
	for pos := 0; pos < len(keys); {
		next := e.child(keys[pos])
		if next == nil {
			return
		}
		m := commonPrefix(next.keys, keys[pos:])
		if pos > 0 && at == nil && len(out.List)-start > rankScanMax {
			at = rankPositionsOf(out.List, start)
		}
		for _, h := range next.holds {
			if h.expires <= now || a.stale(rm, h) {
				continue
			}
			if pos == 0 {
				out.List = append(out.List, Match{Rank: h.rank, Tiers: Tiers{Device: uint32(m)}})
				continue
			}
			// A rank counts here only if it held every block before
			// this edge: its match then ends where this edge starts. A
			// rank can hold a deeper edge and not a shallower one for a
			// while (an eviction takes a split's shallower copy of its
			// hold first), and must not be credited with the gap.
			if i := at.find(out.List, start, h.rank); i >= 0 && out.List[i].Tiers.Device == uint32(pos) {
				out.List[i].Tiers.Device = uint32(pos + m)
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
	root := a.parts[p]
	if root == nil {
		return
	}
	rm := a.removed[root]
	if rm == nil {
		rm = map[uint64]int64{}
		a.removed[root] = rm
	}
	rm[workerID] = a.now().UnixNano()
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
	rm := a.removed[root]
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
				if h.expires <= now || a.stale(rm, h) {
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
