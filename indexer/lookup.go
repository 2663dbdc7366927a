package indexer

import (
	"sync"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Lookups: how deep each rank holds a prompt's prefix, by tier.

// lookupWarm is how many blocks ahead a lookup finds in the node table
// at once (resolve, BenchmarkFindMatchesCold). A prompt's match often
// ends inside a window, so a larger one reads more for nothing.
const lookupWarm = 32

// A window is found in one resolve, which takes at most aheadMax keys.
var _ [aheadMax - lookupWarm]struct{}

// nextWindow returns the chain keys of blocks [depth, depth+lookupWarm):
// chain's own when given, else chained from key (the key of block
// depth-1; blocks[0] itself at depth 0) and appended to buf.
func nextWindow(buf, blocks, chain []uint64, depth int, key uint64) []uint64 {
	end := min(depth+lookupWarm, len(blocks))
	if chain != nil {
		return chain[depth:end]
	}
	for d := depth; d < end; d++ {
		if d == 0 {
			key = blocks[0]
		} else {
			key = selection.NextSequenceHash(key, blocks[d])
		}
		buf = append(buf, key)
	}
	return buf
}

var slotPool = sync.Pool{New: func() any { s := []int32{}; return &s }}

// lookupHoldDefault is how long a lookup holds the tree's read lock
// before it lets go for a moment (Index.lookupHold). An event's Apply
// waits for the write lock, and a Go RWMutex makes a waiting writer wait
// for every reader inside: held for a whole cold 6,000-block walk (~0.5
// ms), every event of every publisher would queue behind each lookup.
// Letting go once the hold passes this bounds an event's wait in time.
// It was a count of blocks (every 128) until that was measured against
// lookups spread out as a gateway's are (BenchmarkIngestFleetProcess
// with LOOKUP_EVERY): there a 100k-token lookup let events in ~48
// times, each a payload's apply and a wait for a core, and its median
// during ingest was 4-8 times its idle one (1.4-2 times by time) for no
// more ingest. By time, a hot lookup finishes in one hold. The walk sees
// events applied while it let go: a rank's depth is still a prefix it
// held at some moment during the lookup, which is all a routing estimate
// needs.
const lookupHoldDefault = 100 * time.Microsecond

// lookupYield is how many blocks the walk goes between looks at the
// clock (a clock read costs about as much as a block).
const lookupYield = 128

// FindMatches implements selection.Indexer. A rank's device depth is its
// prefix run in the device tier; its host depth continues that run through
// blocks it holds in the host tier, and its disk depth continues through
// disk or external blocks, each block counted once in its best tier.
func (x *Index) FindMatches(p selection.PartitionKey, blocks []uint64, out *selection.Matches) {
	x.findMatches(p, blocks, nil, out)
}

// FindMatchesChain implements selection.ChainIndexer: chain[i] is the
// public sequence hash of blocks [0..i], which is our block key.
func (x *Index) FindMatchesChain(p selection.PartitionKey, chain []uint64, out *selection.Matches) {
	x.findMatches(p, chain, chain, out)
}

// findMatches walks the prompt's blocks; each block's key is chain[i] when
// given, else chained from blocks as far as the walk goes (a prompt
// usually stops matching long before its end).
func (x *Index) findMatches(p selection.PartitionKey, blocks, chain []uint64, out *selection.Matches) {
	t := x.tree(p)
	if t == nil || len(blocks) == 0 {
		return
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	held := time.Now()
	start := len(out.List)
	n := t.nodes.get(blocks[0]) // the first key is the first block hash either way
	if n == 0 {
		return
	}
	mark := x.MaxEntries > 0
	if mark {
		t.markUsed(n)
	}
	meta := t.loadMeta(n)
	// One slot per rank holding the first block; only they can match.
	sp := slotPool.Get().(*[]int32)
	defer slotPool.Put(sp)
	slotOf := *sp
	if len(slotOf) < len(t.rankList) {
		slotOf = make([]int32, len(t.rankList))
		for i := range slotOf {
			slotOf[i] = -1
		}
		*sp = slotOf
	}
	var ids []uint32
	t.eachHolder(n, meta, func(id uint32, _ Tier, _ uint64) {
		if slotOf[id] < 0 {
			slotOf[id] = int32(len(out.List) - start)
			ids = append(ids, id)
			out.List = append(out.List, selection.Match{Rank: t.rankList[id]})
		}
	})
	defer func() {
		for _, id := range ids {
			slotOf[id] = -1
		}
	}()
	ranks := len(out.List) - start
	phase := make([]uint8, ranks) // 0 device run, 1 host continuation, 2 disk
	best := make([]Tier, ranks)
	alive := make([]int32, ranks) // slots still matching
	for i := range alive {
		alive[i] = int32(i)
	}
	// A block whose holders are the same as its parent's does to every
	// rank what the parent did: such runs (a shared system prompt held by
	// many ranks) are counted, not walked rank by rank.
	var prevFP uint32
	repeat := uint32(0)
	flush := func() {
		if repeat == 0 {
			return
		}
		for _, i := range alive {
			m := &out.List[start+int(i)]
			switch phase[i] {
			case 0:
				m.Tiers.Device += repeat
			case 1:
				m.Tiers.Host += repeat
			default:
				m.Tiers.Disk += repeat
			}
		}
		repeat = 0
	}
	// The walk's keys come a window at a time, found in passes whose
	// loads overlap (resolve, warm.go); the walk then reads their records
	// in cache.
	var buf [lookupWarm]uint64
	var found [lookupWarm]uint32
	var window []uint64
	stale := false // the window was found before the lookup let an event in
	key := blocks[0]
	for depth := range blocks {
		if depth%lookupWarm == 0 {
			window = nextWindow(buf[:0], blocks, chain, depth, key)
			t.nodes.resolve(window, found[:])
			stale = false
		}
		if depth > 0 {
			key = window[depth%lookupWarm]
			if depth%lookupYield == 0 && time.Since(held) >= x.lookupHold {
				// Let a waiting event in (see lookupHoldDefault); n is
				// fetched again below, so no record is held across the gap,
				// and the window's finds are stale (an event may have freed
				// and reused their records).
				t.mu.RUnlock()
				if x.lookupGap != nil {
					x.lookupGap()
				}
				t.mu.RLock()
				held = time.Now()
				stale = true
			}
			if n = found[depth%lookupWarm]; stale {
				n = t.nodes.get(key)
			}
			if n == 0 {
				break
			}
			if mark {
				t.markUsed(n)
			}
			meta = t.loadMeta(n)
			fp := t.fingerprint(n, meta)
			if fp == prevFP {
				repeat++
				continue
			}
			flush()
			prevFP = fp
		} else {
			prevFP = t.fingerprint(n, meta)
		}
		for _, i := range alive {
			best[i] = 255
		}
		t.eachHolder(n, meta, func(id uint32, tier Tier, _ uint64) {
			if int(id) >= len(slotOf) {
				return // a rank first seen while the lookup let an event in: it did not hold the first block
			}
			if i := slotOf[id]; i >= 0 && tier < best[i] {
				best[i] = tier
			}
		})
		live := alive[:0]
		for _, i := range alive {
			m := &out.List[start+int(i)]
			switch b := best[i]; {
			case b == Device && phase[i] == 0:
				m.Tiers.Device++
			case b <= Host && phase[i] <= 1:
				phase[i] = 1
				m.Tiers.Host++
			case b <= External:
				phase[i] = 2
				m.Tiers.Disk++
			default:
				continue // the rank's match ends here
			}
			live = append(live, i)
		}
		if alive = live; len(alive) == 0 {
			return
		}
	}
	flush()
}
