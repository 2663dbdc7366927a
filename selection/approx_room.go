package selection

import (
	"math"
	"sync/atomic"
)

// The approximate index's memory bound. Every booked prompt adds its
// blocks to the index for ApproxTTL, so without a bound the index grows
// with the rate of new prompts times the TTL: a client sending unique
// prompts, or another replica sending records, decides how much memory it
// takes. With one, a record that would pass the bound first evicts the
// holds soonest to expire (those least recently booked), down to three
// quarters of the bound, so the prefixes still being booked stay.

// What the index's parts cost on the heap, estimated (TestApproxRoomEstimate
// compares the sum with the heap's growth): an edge (its struct and its
// entry in its parent's map, or the map itself), a block (its chain key
// and its local hash) and a rank's hold on an edge.
const (
	approxEdgeBytes  = 176
	approxBlockBytes = 16
	approxHoldBytes  = 24
)

// approxRoom is what the index holds against its bound.
type approxRoom struct {
	maxBytes int64 // 0: no bound
	bytes    int64 // estimated heap of the live trie

	evicted atomic.Uint64 // (block, rank) holds dropped before their TTL to make room
	refused atomic.Uint64 // (block, rank) holds not recorded: no room even after eviction
}

// edgeCost is an edge of blocks blocks with holds holds.
func edgeCost(blocks, holds int) int64 {
	return approxEdgeBytes + int64(blocks)*approxBlockBytes + int64(holds)*approxHoldBytes
}

// freed adds up what a prune drops.
type freed struct {
	bytes      int64
	liveBlocks uint64 // (block, rank) holds dropped before they expired
}

func (f *freed) hold(h approxHold, blocks int, now int64) {
	f.bytes += approxHoldBytes
	if h.expires > now {
		f.liveBlocks += uint64(blocks)
	}
}

// drop adds e and everything below it, once it is cut from the trie.
func (e *approxEdge) drop(now int64, f *freed) {
	f.bytes += edgeCost(len(e.keys), 0)
	for _, h := range e.holds {
		f.hold(h, len(e.keys), now)
	}
	for _, c := range e.children {
		c.drop(now, f)
	}
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
// A record costs at most its blocks and a hold on each, two edges (a
// split and the new run) and the holds a split copies, which the estimate
// leaves out: a split copies one edge's holds, a few ranks'.
func (a *ApproxIndex) roomFor(blocks int, now int64) bool {
	if a.room.maxBytes == 0 {
		return true
	}
	need := int64(blocks)*(approxBlockBytes+approxHoldBytes) + 2*approxEdgeBytes
	if a.room.bytes+need <= a.room.maxBytes {
		return true
	}
	a.evictLocked(now)
	if a.room.bytes+need <= a.room.maxBytes {
		return true
	}
	a.room.refused.Add(uint64(blocks))
	return false
}

// evictLocked drops the holds soonest to expire (expired ones first) until
// the index is at three quarters of its bound. An edge goes with its
// latest hold, so each edge's cost counts at that hold's expiry; a
// histogram of what dropping each expiry frees, over the live expiries'
// span, gives the cutoff. Three walks of the trie: a pass makes room for
// a quarter of the bound, so their cost is shared by the records that
// fill that quarter.
func (a *ApproxIndex) evictLocked(now int64) {
	need := a.room.bytes - a.room.maxBytes/4*3
	if need <= 0 {
		return
	}
	lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
	a.eachEdge(func(e *approxEdge) {
		for _, h := range e.holds {
			lo, hi = min(lo, h.expires), max(hi, h.expires)
		}
	})
	if lo > hi {
		return
	}
	var freedAt [evictBuckets]int64
	span := uint64(hi-lo) + 1
	bucket := func(exp int64) int { return int(uint64(exp-lo) * evictBuckets / span) }
	if span > math.MaxUint64/evictBuckets {
		bucket = func(exp int64) int { return int(uint64(exp-lo) / (span/evictBuckets + 1)) }
	}
	a.eachEdge(func(e *approxEdge) {
		last := int64(math.MinInt64)
		for _, h := range e.holds {
			freedAt[bucket(h.expires)] += approxHoldBytes
			last = max(last, h.expires)
		}
		if last != math.MinInt64 {
			freedAt[bucket(last)] += edgeCost(len(e.keys), 0)
		}
	})
	cut := evictBuckets - 1
	for b, sum := 0, int64(0); b < evictBuckets; b++ {
		if sum += freedAt[b]; sum >= need {
			cut = b
			break
		}
	}
	a.pruneLocked(func(h approxHold) bool { return bucket(h.expires) > cut }, now)
}

// evictBuckets is the histogram's resolution: a pass evicts at most
// 1/evictBuckets of the live span's holds more than it must.
const evictBuckets = 1024

// eachEdge calls fn on every edge below the roots.
func (a *ApproxIndex) eachEdge(fn func(*approxEdge)) {
	var walk func(e *approxEdge)
	walk = func(e *approxEdge) {
		for _, c := range e.children {
			fn(c)
			walk(c)
		}
	}
	for _, root := range a.parts {
		walk(root)
	}
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
