package selection

import "sync/atomic"

// The approximate index's memory bound. Every booked prompt adds its
// blocks to the index for ApproxTTL, so without a bound the index grows
// with the rate of new prompts times the TTL: a client sending unique
// prompts, or another replica sending records, decides how much memory it
// takes. With one, a record that would pass the bound first evicts the
// holds soonest to expire (those least recently booked) from the front
// of the expiry queue, as many as it needs room for: no walk of the trie,
// so a booking never waits for more than its own share.

// What the index's parts cost on the heap, estimated (TestApproxRoomEstimate
// compares the sum with the heap's growth): an edge (its struct and its
// entry in its parent's map), the map of an edge's children (its header
// and first group of slots), a block (its chain key and its local hash),
// a rank's hold on an edge, and an entry in the expiry queue (32 bytes,
// and its chunk's room to grow).
const (
	approxEdgeBytes  = 128
	approxMapBytes   = 208
	approxBlockBytes = 16
	approxHoldBytes  = 24
	approxQueueBytes = 40
)

// approxRoom is what the index holds against its bound.
type approxRoom struct {
	maxBytes int64 // 0: no bound
	bytes    int64 // estimated heap of the live trie and its queue

	evicted atomic.Uint64 // (block, rank) holds dropped before their TTL to make room
	refused atomic.Uint64 // (block, rank) holds not recorded: no room even after eviction
}

// edgeCost is an edge of blocks blocks with holds holds.
func edgeCost(blocks, holds int) int64 {
	return approxEdgeBytes + int64(blocks)*approxBlockBytes + int64(holds)*approxHoldBytes
}

// mapCost is e's map of children, if it has one.
func mapCost(e *approxEdge) int64 {
	if e.children == nil {
		return 0
	}
	return approxMapBytes
}

// cut marks e removed and lets go of what it holds: the queue's stale
// entries keep only the struct alive until they are taken.
func (e *approxEdge) cut() {
	*e = approxEdge{removed: true}
}

// SetMaxMemory bounds the index's estimated heap at bytes (0: no bound).
// What the process holds for it is more: the collector lets the heap grow
// past what is live before it collects.
func (a *ApproxIndex) SetMaxMemory(bytes int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.room.maxBytes = max(bytes, 0)
}

// roomFor makes room for a record of blocks blocks, evicting if it must;
// false when there is none even then (the record is refused and counted).
// A record costs at most its blocks and a hold and a queue entry on each,
// two edges (a split and the new run) and the holds a split copies, which
// the estimate leaves out: a split copies one edge's holds, a few ranks'.
func (a *ApproxIndex) roomFor(blocks int, now int64) bool {
	if a.room.maxBytes == 0 {
		return true
	}
	need := int64(blocks)*(approxBlockBytes+approxHoldBytes+approxQueueBytes) + 2*(approxEdgeBytes+approxMapBytes)
	for a.room.bytes+need > a.room.maxBytes && a.expiries.len() > 0 {
		a.takeFrontLocked(now)
	}
	if a.room.bytes+need <= a.room.maxBytes {
		return true
	}
	a.room.refused.Add(uint64(blocks))
	return false
}

// ApproxRoom is what the approximate index holds against its bound.
type ApproxRoom struct {
	// Bytes is the index's estimated heap; MaxBytes its bound (0: none).
	Bytes, MaxBytes int64
	// Evicted counts (block, rank) holds dropped before their TTL to make
	// room; Refused those not recorded because even eviction made none.
	Evicted, Refused uint64
}

// Room reports what the index holds against its bound.
func (a *ApproxIndex) Room() ApproxRoom {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return ApproxRoom{Bytes: a.room.bytes, MaxBytes: a.room.maxBytes,
		Evicted: a.room.evicted.Load(), Refused: a.room.refused.Load()}
}

// ApproxRoom reports the approximate index's room; false when the router
// runs on another index.
func (r *Router) ApproxRoom() (ApproxRoom, bool) {
	ai, ok := r.index.(*ApproxIndex)
	if !ok {
		return ApproxRoom{}, false
	}
	return ai.Room(), true
}
