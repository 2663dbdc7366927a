package selection

import (
	"sync"
	"time"
)

// Tiers is a rank's prefix match for one prompt, in blocks, each block
// counted once in its highest tier (spec §3.2): Device is the GPU prefix
// depth, Host the host-pinned continuation beyond it, Disk the disk or
// external continuation beyond that.
type Tiers struct {
	Device, Host, Disk uint32
}

// Match is one rank's entry in a Matches result.
type Match struct {
	Rank  Rank
	Tiers Tiers
}

// Matches collects the ranks with a non-zero match. A rank that is absent
// matched nothing. It is reused across calls to avoid allocation.
type Matches struct {
	List []Match
}

// Reset empties m for reuse.
func (m *Matches) Reset() { m.List = m.List[:0] }

// Indexer answers "how much of this prompt does each rank already hold?"
// for a partition. The event-fed KV index implements it; until a partition
// uses events, the approximate index fed by bookings does.
type Indexer interface {
	// FindMatches appends to out the prefix depth, per tier, of every rank
	// of partition p that holds the first block of blocks (local block
	// hashes, in prompt order).
	FindMatches(p PartitionKey, blocks []uint64, out *Matches)
	// RemoveWorker drops everything the index holds for a worker.
	RemoveWorker(p PartitionKey, workerID uint64)
	// Dump returns the partition's content as single-block Stored events,
	// parents before children, so that replaying them rebuilds it.
	Dump(p PartitionKey) []RouterEvent
}

// BookingRecorder is implemented by indexes that learn from bookings (the
// approximate mode): a booked prompt is assumed cached on its rank.
type BookingRecorder interface {
	RecordBooking(p PartitionKey, r Rank, blocks []uint64)
}

// RouterEvent is Dynamo's KV event as /dump serializes it (spec §1.4.9).
type RouterEvent struct {
	WorkerID    uint64  `json:"worker_id"`
	StorageTier string  `json:"storage_tier"`
	Event       KVEvent `json:"event"`
}

// KVEvent is the body of a RouterEvent.
type KVEvent struct {
	EventID uint64     `json:"event_id"`
	Data    StoredData `json:"data"`
	DPRank  uint32     `json:"dp_rank"`
}

// StoredData is the "stored" variant of an event's data, the only one a
// dump contains.
type StoredData struct {
	Stored StoredEvent `json:"stored"`
}

// StoredEvent is a block store: blocks chained under ParentHash.
type StoredEvent struct {
	ParentHash *uint64       `json:"parent_hash"`
	Blocks     []StoredBlock `json:"blocks"`
}

// StoredBlock is one stored block: the engine's hash and our local hash.
type StoredBlock struct {
	BlockHash   uint64 `json:"block_hash"`
	TokensHash  uint64 `json:"tokens_hash"`
	MMExtraInfo any    `json:"mm_extra_info"`
}

// ApproxIndex is Dynamo's approximate mode (use_kv_events false): every
// booked prompt is assumed cached on its rank for a TTL. Prefixes are keyed
// by the chain of local block hashes, so a block only matches at the same
// position after the same prefix.
type ApproxIndex struct {
	ttl time.Duration
	now func() time.Time

	mu        sync.RWMutex
	parts     map[PartitionKey]map[uint64]*approxNode
	lastSweep time.Time
}

type approxNode struct {
	local, parent uint64
	root          bool
	holders       []approxHold
}

type approxHold struct {
	rank    Rank
	expires int64 // unix nanoseconds
}

// NewApproxIndex returns an approximate index whose entries live for ttl.
func NewApproxIndex(ttl time.Duration) *ApproxIndex {
	return &ApproxIndex{ttl: ttl, now: time.Now, parts: make(map[PartitionKey]map[uint64]*approxNode)}
}

// chainHash extends a prefix key by one local block hash. The first block
// is keyed by its own hash, so the chain equals the public sequence hashes.
func chainHash(prev uint64, i int, local uint64) uint64 {
	if i == 0 {
		return local
	}
	return NextSequenceHash(prev, local)
}

// RecordBooking marks blocks as cached on r until the TTL passes.
func (a *ApproxIndex) RecordBooking(p PartitionKey, r Rank, blocks []uint64) {
	now := a.now()
	exp := now.Add(a.ttl).UnixNano()
	a.mu.Lock()
	defer a.mu.Unlock()
	if now.Sub(a.lastSweep) > a.ttl/4 {
		a.sweepLocked(now.UnixNano())
		a.lastSweep = now
	}
	nodes := a.parts[p]
	if nodes == nil {
		nodes = make(map[uint64]*approxNode)
		a.parts[p] = nodes
	}
	var prev uint64
	for i, local := range blocks {
		key := chainHash(prev, i, local)
		n := nodes[key]
		if n == nil {
			n = &approxNode{local: local, parent: prev, root: i == 0}
			nodes[key] = n
		}
		found := false
		for j := range n.holders {
			if n.holders[j].rank == r {
				n.holders[j].expires = exp
				found = true
				break
			}
		}
		if !found {
			n.holders = append(n.holders, approxHold{rank: r, expires: exp})
		}
		prev = key
	}
}

func (a *ApproxIndex) sweepLocked(now int64) {
	for p, nodes := range a.parts {
		for k, n := range nodes {
			live := n.holders[:0]
			for _, h := range n.holders {
				if h.expires > now {
					live = append(live, h)
				}
			}
			n.holders = live
			if len(live) == 0 {
				delete(nodes, k)
			}
		}
		if len(nodes) == 0 {
			delete(a.parts, p)
		}
	}
}

// FindMatches implements Indexer. Only the device tier is ever populated.
//
// Every booking records its whole path and refreshes every node on it, so
// along a path a rank's expiry never grows with depth: the nodes a rank
// still holds form a prefix. Its match depth is therefore found by a binary
// search over the path, not by checking every rank at every depth.
func (a *ApproxIndex) FindMatches(p PartitionKey, blocks []uint64, out *Matches) {
	now := a.now().UnixNano()
	a.mu.RLock()
	defer a.mu.RUnlock()
	nodes := a.parts[p]
	if len(nodes) == 0 || len(blocks) == 0 {
		return
	}
	path := approxPathPool.Get().(*[]*approxNode)
	defer approxPathPool.Put(path)
	*path = (*path)[:0]
	var prev uint64
	for i, local := range blocks {
		key := chainHash(prev, i, local)
		prev = key
		n := nodes[key]
		if n == nil {
			break
		}
		*path = append(*path, n)
	}
	if len(*path) == 0 {
		return
	}
	for _, h := range (*path)[0].holders {
		if h.expires <= now {
			continue
		}
		// Invariant: the rank holds path[lo-1]; find the first depth it lacks.
		lo, hi := 1, len(*path)
		for lo < hi {
			mid := int(uint(lo+hi) >> 1)
			if (*path)[mid].holds(h.rank, now) {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		out.List = append(out.List, Match{Rank: h.rank, Tiers: Tiers{Device: uint32(lo)}})
	}
}

var approxPathPool = sync.Pool{New: func() any { p := make([]*approxNode, 0, 1024); return &p }}

func (n *approxNode) holds(r Rank, now int64) bool {
	for _, h := range n.holders {
		if h.rank == r {
			return h.expires > now
		}
	}
	return false
}

// RemoveWorker implements Indexer.
func (a *ApproxIndex) RemoveWorker(p PartitionKey, workerID uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, n := range a.parts[p] {
		live := n.holders[:0]
		for _, h := range n.holders {
			if h.rank.WorkerID != workerID {
				live = append(live, h)
			}
		}
		n.holders = live
		if len(live) == 0 {
			delete(a.parts[p], k)
		}
	}
}

// Dump implements Indexer: one Stored event per (block, rank), parents
// first. The chain key stands in for the engine's block hash.
func (a *ApproxIndex) Dump(p PartitionKey) []RouterEvent {
	now := a.now().UnixNano()
	a.mu.RLock()
	defer a.mu.RUnlock()
	nodes := a.parts[p]
	children := make(map[uint64][]uint64)
	var roots []uint64
	for k, n := range nodes {
		if n.root {
			roots = append(roots, k)
		} else {
			children[n.parent] = append(children[n.parent], k)
		}
	}
	var events []RouterEvent
	queue := roots
	for len(queue) > 0 {
		k := queue[0]
		queue = queue[1:]
		n := nodes[k]
		for _, h := range n.holders {
			if h.expires <= now {
				continue
			}
			var parent *uint64
			if !n.root {
				v := n.parent
				parent = &v
			}
			events = append(events, RouterEvent{
				WorkerID:    h.rank.WorkerID,
				StorageTier: "device",
				Event: KVEvent{
					EventID: uint64(len(events)),
					DPRank:  h.rank.DPRank,
					Data: StoredData{Stored: StoredEvent{
						ParentHash: parent,
						Blocks:     []StoredBlock{{BlockHash: k, TokensHash: n.local}},
					}},
				},
			})
		}
		queue = append(queue, children[k]...)
	}
	return events
}
