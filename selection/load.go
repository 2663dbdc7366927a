package selection

import (
	"math"
	"time"
)

// Load accounting (docs/selection-api.md, "How a rank is chosen" and
// "Reservations"): what bookings add to each rank. All of
// it is guarded by the owning partition's mutex.
//
// Active prompt blocks live in a compressed prefix trie, as in Dynamo: a
// booking's tracking hashes are a path from the root, each edge a run of
// blocks, and every edge keeps per-rank counts of the bookings that cover
// it. A shared prefix therefore counts once per rank, and booking, freeing
// or measuring a prompt costs one sequential comparison per block plus a
// map probe per edge, not a map probe per block.

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
	loadOnly   bool // its engine runs another block size than the prompts are hashed with: no cache credit (enginefacts.go)
	down       bool // unreachable (health.go): not a candidate

	prefillTokens uint64
	requests      uint64
	// decodeWeight is the weighted count of unique active blocks.
	decodeWeight float64
}

// full reports whether the rank is at Config.MaxReservationsPerRank.
func (rs *rankState) full(cfg *Config) bool {
	return cfg.MaxReservationsPerRank > 0 && rs.requests >= uint64(cfg.MaxReservationsPerRank)
}

func (rs *rankState) decodeBlocks() uint64 { return decodeBlocksOf(rs.decodeWeight) }

// decodeBlocksOf rounds a rank's weighted count of active blocks.
func decodeBlocksOf(weight float64) uint64 { return uint64(math.Round(math.Max(weight, 0))) }

// edge is a run of blocks in the trie. Every booking ends on an edge
// boundary (edges are split to make it so), so a rank's count on an edge
// covers all of its blocks.
type edge struct {
	hashes []uint64 // the run's tracking hashes; shared with a booking, never written
	// buf is the pooled buffer hashes is a slice of (hashbuf.go), held
	// until the edge leaves the trie; nil when the collector owns them.
	buf      *hashBuf
	parent   *edge
	children map[uint64]*edge // keyed by the child's first hash
	holds    []edgeHold
}

// edgeHold is one rank's hold on an edge: how many of its bookings cover
// it, and the weight each block counts with (1, or a decay fraction while
// one booking holds it alone).
type edgeHold struct {
	rs     *rankState
	count  uint32
	weight float32
}

func (e *edge) hold(rs *rankState) *edgeHold {
	for i := range e.holds {
		if e.holds[i].rs == rs {
			return &e.holds[i]
		}
	}
	return nil
}

// booking is one live reservation's load on a rank.
type booking struct {
	id     string
	key    PartitionKey
	part   *partition
	rs     *rankState
	hashes []uint64 // tracking hashes, owned and never modified
	// buf is the pooled buffer hashes is, when it is one (a lean booking,
	// hashbuf.go): held until the booking is freed, when hashes is
	// dropped. Nil when the collector owns hashes.
	buf       *hashBuf
	outputs   int     // output blocks added
	outWeight float64 // their weighted count
	prefill   uint64  // outstanding prefill tokens (0 once complete)
	isl       uint64
	expected  *uint32
	session   string
	// lease is the session binding the booking holds a lease of: released
	// into that binding only, not into one made since for the session.
	lease  *binding
	client string // for Config.MaxReservationsPerClient
	// blocks is how many prompt blocks the booking counts against its
	// client (Config.MaxReservationBlocksPerClient): its hashes' length
	// when booked, kept apart since freeing the load drops the hashes.
	blocks    int
	createdAt time.Time
	freed     bool
}

// loadTracker is a partition's trie of active prompt blocks.
type loadTracker struct {
	root edge
}

func newLoadTracker() loadTracker { return loadTracker{root: edge{children: map[uint64]*edge{}}} }

func commonPrefix(a, b []uint64) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// split cuts e after its first k blocks; e keeps the head and a new child
// takes the tail, with e's children and a copy of its holds (every booking
// covering e covered all of it, so it covers both halves).
func (e *edge) split(k int) {
	tail := &edge{hashes: e.hashes[k:], buf: e.buf, parent: e, children: e.children, holds: append([]edgeHold(nil), e.holds...)}
	e.buf.retain()
	for _, c := range tail.children {
		c.parent = tail
	}
	e.hashes = e.hashes[:k:k]
	e.children = map[uint64]*edge{tail.hashes[0]: tail}
}

func (e *edge) child(h uint64) *edge {
	if e.children == nil {
		return nil
	}
	return e.children[h]
}

func (e *edge) addChild(c *edge) {
	if e.children == nil {
		e.children = make(map[uint64]*edge, 1)
	}
	c.parent = e
	e.children[c.hashes[0]] = c
}

// add books b on its rank.
func (t *loadTracker) add(b *booking, trackBlocks bool) {
	rs := b.rs
	rs.requests++
	rs.prefillTokens += b.prefill
	if !trackBlocks || len(b.hashes) == 0 {
		return
	}
	h := b.hashes
	e := &t.root
	for pos := 0; pos < len(h); {
		next := e.child(h[pos])
		if next == nil {
			// The rest of the chain is new: one edge, sharing b's hashes.
			next = &edge{hashes: h[pos:], buf: b.buf}
			b.buf.retain()
			e.addChild(next)
		}
		m := commonPrefix(next.hashes, h[pos:])
		if m < len(next.hashes) {
			next.split(m) // b ends or diverges inside the edge
		}
		takeHold(next, rs)
		pos += m
		e = next
	}
}

func takeHold(e *edge, rs *rankState) {
	if eh := e.hold(rs); eh != nil {
		if eh.count == 1 && eh.weight != 1 {
			// No longer held alone: decayed blocks count fully again.
			rs.decodeWeight += float64(len(e.hashes)) * float64(1-eh.weight)
			eh.weight = 1
		}
		eh.count++
		return
	}
	e.holds = append(e.holds, edgeHold{rs: rs, count: 1, weight: 1})
	rs.decodeWeight += float64(len(e.hashes))
}

// path calls fn on each edge of b's chain, deepest last. Every booking ends
// on an edge boundary, so the chain is a whole number of edges.
func (t *loadTracker) path(b *booking, fn func(e *edge)) {
	h := b.hashes
	e := &t.root
	for pos := 0; pos < len(h); {
		next := e.child(h[pos])
		if next == nil {
			return // cannot happen while b holds its path
		}
		pos += len(next.hashes)
		fn(next)
		e = next
	}
}

// free removes b's load from its rank and lets go of its hashes. It is
// idempotent.
func (t *loadTracker) free(b *booking, trackBlocks bool) {
	if b.freed {
		return
	}
	b.freed = true
	rs := b.rs
	rs.requests--
	rs.prefillTokens -= b.prefill
	b.prefill = 0
	rs.decodeWeight -= b.outWeight
	if trackBlocks && len(b.hashes) > 0 {
		t.unhold(b)
	}
	if b.buf != nil {
		// The booking is done with its pooled hashes; the edges that
		// still share them hold the buffer on their own.
		b.buf.release()
		b.buf, b.hashes = nil, nil
	}
}

// unhold takes b's holds off its chain and drops the edges left unheld.
func (t *loadTracker) unhold(b *booking) {
	rs := b.rs
	var empty *edge // the shallowest edge left with no holds
	t.path(b, func(e *edge) {
		for i := range e.holds {
			eh := &e.holds[i]
			if eh.rs != rs {
				continue
			}
			eh.count--
			if eh.count == 0 {
				rs.decodeWeight -= float64(len(e.hashes)) * float64(eh.weight)
				e.holds[i] = e.holds[len(e.holds)-1]
				e.holds = e.holds[:len(e.holds)-1]
			}
			break
		}
		if len(e.holds) == 0 && empty == nil {
			empty = e
		}
	})
	if empty != nil {
		// Holds only shrink with depth, so everything below is empty too.
		delete(empty.parent.children, empty.hashes[0])
		empty.drop()
	}
}

// drop lets go of the hashes of e and of every edge below it, which have
// left the trie.
func (e *edge) drop() {
	e.buf.release()
	e.buf = nil
	for _, c := range e.children {
		c.drop()
	}
}

// prefillComplete zeroes b's prefill contribution.
func (t *loadTracker) prefillComplete(b *booking) {
	b.rs.prefillTokens -= b.prefill
	b.prefill = 0
}

// outputBlock adds one never-shared output block to b and, with a decay
// fraction, re-weights every block b holds alone: its outputs and the
// edges of its prompt no other booking of the rank covers.
func (t *loadTracker) outputBlock(b *booking, decay *float64, trackBlocks bool) {
	b.outputs++
	b.outWeight++
	b.rs.decodeWeight++
	if decay == nil {
		return
	}
	f := *decay
	b.rs.decodeWeight += f*float64(b.outputs) - b.outWeight
	b.outWeight = f * float64(b.outputs)
	if !trackBlocks {
		return
	}
	w := float32(f)
	t.path(b, func(e *edge) {
		if eh := e.hold(b.rs); eh != nil && eh.count == 1 {
			b.rs.decodeWeight += float64(len(e.hashes)) * float64(w-eh.weight)
			eh.weight = w
		}
	})
}

// countActive sets, for every rank, how many leading blocks of hashes it
// already holds (indexed by rankState.idx): one walk down the trie.
func (t *loadTracker) countActive(hashes []uint64, hits []uint32) {
	e := &t.root
	for pos := 0; pos < len(hashes); {
		next := e.child(hashes[pos])
		if next == nil {
			return
		}
		m := commonPrefix(next.hashes, hashes[pos:])
		for _, eh := range next.holds {
			if !eh.rs.removed {
				hits[eh.rs.idx] = uint32(pos + m)
			}
		}
		if m < len(next.hashes) {
			return
		}
		pos += m
		e = next
	}
}

// activeFor is countActive for one rank: how many leading blocks of
// hashes rs already holds.
func (t *loadTracker) activeFor(hashes []uint64, rs *rankState) uint32 {
	var held uint32
	e := &t.root
	for pos := 0; pos < len(hashes); {
		next := e.child(hashes[pos])
		if next == nil {
			return held
		}
		m := commonPrefix(next.hashes, hashes[pos:])
		if next.hold(rs) == nil {
			return held // holds only shrink with depth
		}
		held = uint32(pos + m)
		if m < len(next.hashes) {
			return held
		}
		pos += m
		e = next
	}
	return held
}
