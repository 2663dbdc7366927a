package indexer

import (
	"sync"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// The tree of one partition: its blocks (records), their holders (ranks
// and tiers) and each rank's table from engine hashes to entries.

// tree is one partition's index.
type tree struct {
	// Writers take writeMu, then mu (lockWrite); lookups take mu's read
	// lock alone, so that a large table grows with writeMu held and mu
	// free (grow.go). toGrow lists the tables a write left to grow.
	writeMu   sync.Mutex
	toGrow    []*refTable
	mu        sync.RWMutex
	blockSize int // fixed for the tree's life: read without the lock
	eagle     bool
	recs      slab[record]                 // blocks, with their inline holder and entry
	exts      slab[ext]                    // further holders and entries (record.go)
	nodes     *refTable                    // chain key → record
	ranks     map[selection.Rank]*refTable // per rank: engine hash → entry ref
	sets      slab[holderSet]              // shared blocks' further holders
	// rankIDs numbers the ranks densely, so holders store 4 bytes and a
	// lookup keeps per-rank state in a slice instead of a map.
	rankIDs  map[selection.Rank]uint32
	rankList []selection.Rank
	// live counts the tree's entries; queues order each rank's entries
	// for eviction (by rank id, evict.go), and compact lists the ranks
	// whose queue an engine's removals left mostly stale.
	live int
	// entryDelta is the change in entries of the events applied under
	// this hold of the write lock, not yet added to Index.entries
	// (flushEntries).
	entryDelta int64
	queues     []evictQueue
	compact    []uint32
	// clears are cleared ranks whose entries are still to be dropped
	// (clear.go).
	clears []*clearing
	// peaks remember the largest size of the node table and of each
	// rank's table since they were last rebuilt: tables never shrink.
	nodesPeak int
	rankPeaks []int // by rank id
	// groups is the KV-cache group each rank's events are followed in,
	// plus one (0: not yet known), by rank id (groups.go).
	groups []int64
	shrink []uint32 // ranks whose table fell to a quarter of its peak (noteShrink)
	// hashes is a store's scratch: its keys' hashes in the node table,
	// then its engine hashes' in the rank's table (store, warm.go); kept
	// between stores up to hashesKeep.
	hashes []uint64
	ahead  removalAhead // a removal's scratch (removeAll, warm.go)
	// salts maps a salted chain's blocks (chain key) to their salt's part
	// of the seed (salt.go); nil while no salted block is held.
	salts map[uint64]uint64
}

func newTree(blockSize int, eagle bool) *tree {
	t := &tree{blockSize: blockSize, eagle: eagle,
		ranks: map[selection.Rank]*refTable{}, rankIDs: map[selection.Rank]uint32{}}
	t.nodes = newRefTable(0, t, false)
	return t
}

// hashesKeep is the largest tree.hashes kept from one store to the next
// (128 KB): an engine's payloads need a few dozen, and a publisher's
// million-block event must not leave megabytes behind.
const hashesKeep = 1 << 14

// addRank gives rank r its engine table, keyed by its entries' engine
// hashes, sized for n, and returns it.
func (t *tree) addRank(x *Index, r selection.Rank, n int) *refTable {
	m := newRefTable(n, t, true)
	m.rank = t.rankID(r)
	t.ranks[r] = m
	x.rankTables.Add(1)
	return m
}

func (t *tree) rankID(r selection.Rank) uint32 {
	id, ok := t.rankIDs[r]
	if !ok {
		id = uint32(len(t.rankList))
		t.rankIDs[r] = id
		t.rankList = append(t.rankList, r)
		t.rankPeaks = append(t.rankPeaks, 0)
		t.queues = append(t.queues, evictQueue{})
		t.groups = append(t.groups, 0)
	}
	return id
}

// nextKey chains a block's local hash onto its parent's key.
func nextKey(parent, local uint64) uint64 { return selection.NextSequenceHash(parent, local) }

// chainKeys appends the chain keys of locals, chained onto prefix (have:
// whether there is a prefix), to dst.
func chainKeys(dst []uint64, prefix uint64, have bool, locals []uint64) []uint64 {
	for _, local := range locals {
		if have {
			prefix = nextKey(prefix, local)
		} else {
			prefix, have = local, true
		}
		dst = append(dst, prefix)
	}
	return dst
}

// extend chains a block (its chain key, the key's hash in the node
// table, and its local hash) onto the prefix (its record; have: whether
// there is a prefix) and returns the block's record, created if new.
func (t *tree) extend(key, h uint64, prefixRec uint32, have bool, local uint64) uint32 {
	c := t.nodes.claimAt(h, key)
	if c.held {
		rec := c.ref()
		if have {
			// The parent's record may be a newer one than the block's
			// first (its first was freed and stored again).
			t.recs.at(rec).parent = prefixRec
		}
		return rec
	}
	rec := t.recs.alloc()
	r := record{key: key, local: local, parent: prefixRec}
	if !have {
		r.parent, r.meta = 0, fRoot
	}
	*t.recs.at(rec) = r
	c.fill(rec)
	t.nodesPeak = max(t.nodesPeak, t.nodes.Len())
	return rec
}
