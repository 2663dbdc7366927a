package indexer

import (
	"sync"
	"sync/atomic"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// The tree of one partition: its nodes (blocks), their holders (ranks and
// tiers) and each rank's table from engine hashes to entries.

// tree is one partition's index.
type tree struct {
	mu        sync.RWMutex
	blockSize int
	eagle     bool
	nodes     *table[*node]                    // chain key → block
	ranks     map[selection.Rank]*table[entry] // per rank: engine hash → entry
	// rankIDs numbers the ranks densely, so holders store 4 bytes and a
	// lookup keeps per-rank state in a slice instead of a map.
	rankIDs  map[selection.Rank]uint32
	rankList []selection.Rank
	slab     []node
	spare    []*node
	// live counts the tree's entries; queue orders them for eviction.
	live  int
	queue evictQueue
	// peaks remember the largest size of the node table and of each
	// rank's table since they were last rebuilt: tables never shrink.
	nodesPeak int
	rankPeaks []int    // by rank id
	shrink    []uint32 // ranks whose map fell to a quarter of its peak (noteShrink)
}

func (t *tree) rankID(r selection.Rank) uint32 {
	id, ok := t.rankIDs[r]
	if !ok {
		id = uint32(len(t.rankList))
		t.rankIDs[r] = id
		t.rankList = append(t.rankList, r)
		t.rankPeaks = append(t.rankPeaks, 0)
	}
	return id
}

// node is one block: a prefix of some prompt. Most blocks have one
// holder, which sits inline.
type node struct {
	local, parent uint64 // our local hash; the parent's chain key
	first         holder
	more          *[]holder // further holders; nil for most blocks
	// fp fingerprints the set of (rank, tier) holders (an XOR of their
	// mixes) and nh counts them, so a lookup can tell in O(1) that a block
	// has the same holders as its parent.
	fp   uint32
	nh   uint16
	root bool
	// used is set by lookups that reach the block while the index is
	// bounded, and cleared by eviction, which gives such a block's
	// entries a second turn in the queue (see evict.go).
	used atomic.Bool
}

// markUsed records a lookup of n; it writes only when the mark is not
// there yet, so concurrent lookups of a hot prefix do not contend.
func (n *node) markUsed() {
	if !n.used.Load() {
		n.used.Store(true)
	}
}

// extra returns the further holders (nil slice when there are none).
func (n *node) extra() []holder {
	if n.more == nil {
		return nil
	}
	return *n.more
}

// mixHolder spreads a (rank id, tier) pair over 64 bits (splitmix64).
func mixHolder(id uint32, tier Tier) uint32 {
	z := uint64(id)<<8 | uint64(tier) + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return uint32(z ^ z>>31)
}

// holder is one rank's copy of a block in one tier.
type holder struct {
	engine uint64 // the rank's engine hash for it (for dumps)
	id     uint32 // tree.rankIDs of the rank
	refs   uint16 // engine entries that map here
	tier   Tier
	used   bool
}

// each calls fn on every holder of n.
func (n *node) each(fn func(h *holder)) {
	if n.first.used {
		fn(&n.first)
	}
	more := n.extra()
	for i := range more {
		fn(&more[i])
	}
}

func (n *node) find(id uint32, tier Tier) *holder {
	if n.first.used && n.first.id == id && n.first.tier == tier {
		return &n.first
	}
	more := n.extra()
	for i := range more {
		if more[i].id == id && more[i].tier == tier {
			return &more[i]
		}
	}
	return nil
}

// drop removes holder h (one of n's); it reports whether n is now empty.
func (n *node) drop(h *holder) bool {
	more := n.extra()
	if h == &n.first {
		if len(more) == 0 {
			n.first = holder{}
			return true
		}
		n.first = more[len(more)-1]
		*n.more = more[:len(more)-1]
		return false
	}
	for i := range more {
		if &more[i] == h {
			more[i] = more[len(more)-1]
			*n.more = more[:len(more)-1]
			break
		}
	}
	return !n.first.used && len(n.extra()) == 0
}

// extend chains a block's local hash onto the prefix key (have: whether
// there is a prefix) and returns the block's key and node, created if new.
func (t *tree) extend(prefix uint64, have bool, local uint64) (uint64, *node) {
	key := local
	if have {
		key = selection.NextSequenceHash(prefix, local)
	}
	p, held := t.nodes.upsert(key)
	if !held {
		*p = t.newNode()
		(*p).local, (*p).parent, (*p).root = local, prefix, !have
		t.nodesPeak = max(t.nodesPeak, t.nodes.Len())
	}
	return key, *p
}

func (t *tree) newNode() *node {
	if k := len(t.spare); k > 0 {
		n := t.spare[k-1]
		t.spare = t.spare[:k-1]
		return n
	}
	if len(t.slab) == 0 {
		t.slab = make([]node, 1024)
	}
	n := &t.slab[0]
	t.slab = t.slab[1:]
	return n
}

func (t *tree) freeNode(key uint64, n *node) {
	t.nodes.del(key)
	more := n.more
	if more != nil {
		*more = (*more)[:0]
	}
	*n = node{more: more}
	t.spare = append(t.spare, n)
}

// entry maps one engine hash of a rank to our blocks: the block key and,
// when the engine's blocks are larger than ours, the span-1 blocks before
// it that the same engine block covers. It is 16 bytes, the size of a map
// slot's value, so the tier and the eviction stamp share a word.
type entry struct {
	key  uint64
	meta uint32 // the tier in the low byte, the eviction stamp's low 24 bits above it
	refs uint16 // saturates: an engine storing one hash 65,535 times is not honest
	span uint16
}

func (e entry) tier() Tier { return Tier(e.meta) }

// stamp is the entry's eviction stamp (its low 24 bits; 0 when stored
// without a bound).
func (e entry) stamp() uint32 { return e.meta >> 8 }
