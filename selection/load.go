package selection

import (
	"math"
	"math/rand/v2"
	"time"
)

// Load accounting (spec §3.3, §3.9): what bookings add to each rank. All of
// it is guarded by the owning partition's mutex.

// rankState is one schedulable rank and its live load.
type rankState struct {
	rank     Rank
	idx      int // position in partition.ranks, for per-call scratch arrays
	endpoint string
	// maxBatched and totalKV are the worker's capacities (0 = unknown).
	maxBatched uint64
	totalKV    uint64
	taints     []string
	removed    bool

	prefillTokens uint64
	requests      uint64
	// decodeWeight is the weighted count of unique active blocks.
	decodeWeight float64
}

func (rs *rankState) decodeBlocks() uint64 { return uint64(math.Round(math.Max(rs.decodeWeight, 0))) }

// holding is one rank's hold on an active block.
type holding struct {
	rs     *rankState
	refs   uint32
	weight float32
}

// holders lists the ranks holding one active block. Most blocks are held by
// one rank, so the first holding sits inline and a map value costs no
// allocation of its own.
type holders struct {
	first holding
	more  []holding
}

func (h *holders) find(rs *rankState) *holding {
	if h.first.rs == rs {
		return &h.first
	}
	for i := range h.more {
		if h.more[i].rs == rs {
			return &h.more[i]
		}
	}
	return nil
}

// remove drops rs's holding; it reports whether no holding is left.
func (h *holders) remove(rs *rankState) bool {
	if h.first.rs == rs {
		if len(h.more) == 0 {
			h.first = holding{}
			return true
		}
		h.first = h.more[len(h.more)-1]
		h.more = h.more[:len(h.more)-1]
		return false
	}
	for i := range h.more {
		if h.more[i].rs == rs {
			h.more[i] = h.more[len(h.more)-1]
			h.more = h.more[:len(h.more)-1]
			break
		}
	}
	return false
}

// booking is one live reservation's load on a rank.
type booking struct {
	id        string
	key       PartitionKey
	part      *partition
	rs        *rankState
	hashes    []uint64 // tracking hashes, owned
	outputs   []uint64 // output block hashes, owned
	prefill   uint64   // outstanding prefill tokens (0 once complete)
	isl       uint64
	expected  *uint32
	session   string
	createdAt time.Time
	freed     bool
}

// loadTracker is a partition's active-block table. Map values are pointers
// so holding and releasing a block cost one map probe each; the holders
// themselves come from slabs and a free list, so booking a fresh block
// costs no allocation of its own.
type loadTracker struct {
	blocks map[uint64]*holders
	slab   []holders
	spare  []*holders
}

func newLoadTracker() loadTracker { return loadTracker{blocks: make(map[uint64]*holders)} }

func (t *loadTracker) newHolders() *holders {
	if n := len(t.spare); n > 0 {
		h := t.spare[n-1]
		t.spare = t.spare[:n-1]
		return h
	}
	if len(t.slab) == 0 {
		t.slab = make([]holders, 1024)
	}
	h := &t.slab[0]
	t.slab = t.slab[1:]
	return h
}

// add books b on its rank.
func (t *loadTracker) add(b *booking, trackBlocks bool) {
	rs := b.rs
	rs.requests++
	rs.prefillTokens += b.prefill
	if !trackBlocks {
		return
	}
	for _, h := range b.hashes {
		t.hold(rs, h)
	}
}

func (t *loadTracker) hold(rs *rankState, h uint64) {
	hs := t.blocks[h]
	if hs == nil {
		hs = t.newHolders()
		hs.first = holding{rs: rs, refs: 1, weight: 1}
		t.blocks[h] = hs
		rs.decodeWeight++
		return
	}
	if e := hs.find(rs); e != nil {
		if e.refs == 1 && e.weight != 1 {
			// No longer exclusive: a decayed block counts fully again.
			rs.decodeWeight += float64(1 - e.weight)
			e.weight = 1
		}
		e.refs++
		return
	}
	hs.more = append(hs.more, holding{rs: rs, refs: 1, weight: 1})
	rs.decodeWeight++
}

func (t *loadTracker) release(rs *rankState, h uint64) {
	hs := t.blocks[h]
	if hs == nil {
		return
	}
	e := hs.find(rs)
	if e == nil {
		return
	}
	e.refs--
	if e.refs > 0 {
		return
	}
	rs.decodeWeight -= float64(e.weight)
	if hs.remove(rs) {
		delete(t.blocks, h)
		*hs = holders{more: hs.more[:0]}
		t.spare = append(t.spare, hs)
	}
}

// free removes b's load from its rank. It is idempotent.
func (t *loadTracker) free(b *booking) {
	if b.freed {
		return
	}
	b.freed = true
	rs := b.rs
	rs.requests--
	rs.prefillTokens -= b.prefill
	b.prefill = 0
	for _, h := range b.hashes {
		t.release(rs, h)
	}
	for _, h := range b.outputs {
		t.release(rs, h)
	}
	if rs.requests == 0 && rs.removed {
		rs.decodeWeight = 0
	}
}

// prefillComplete zeroes b's prefill contribution.
func (t *loadTracker) prefillComplete(b *booking) {
	b.rs.prefillTokens -= b.prefill
	b.prefill = 0
}

// outputBlock adds one never-shared output block to b and, with a decay
// fraction, re-weights the blocks b holds exclusively.
func (t *loadTracker) outputBlock(b *booking, decay *float64) {
	h := rand.Uint64()
	b.outputs = append(b.outputs, h)
	t.hold(b.rs, h)
	if decay == nil {
		return
	}
	w := float32(*decay)
	reweight := func(h uint64) {
		if hs := t.blocks[h]; hs != nil {
			if e := hs.find(b.rs); e != nil && e.refs == 1 {
				b.rs.decodeWeight += float64(w - e.weight)
				e.weight = w
			}
		}
	}
	for _, h := range b.hashes {
		reweight(h)
	}
	for _, h := range b.outputs {
		reweight(h)
	}
}

// countActive adds, for every rank, how many of hashes it already holds
// into hits (indexed by rankState.idx). Cost: one map lookup per hash plus
// one step per (hash, holder) pair, independent of the number of ranks.
func (t *loadTracker) countActive(hashes []uint64, hits []uint32) {
	if len(t.blocks) == 0 {
		return
	}
	for _, h := range hashes {
		hs := t.blocks[h]
		if hs == nil {
			continue
		}
		if rs := hs.first.rs; rs != nil && !rs.removed {
			hits[rs.idx]++
		}
		for i := range hs.more {
			if rs := hs.more[i].rs; !rs.removed {
				hits[rs.idx]++
			}
		}
	}
}
