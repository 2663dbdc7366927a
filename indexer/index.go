package indexer

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Index is the precise prefix index fed by KV events (spec
// selection-service.md §4). Blocks are keyed by our own chain key: the
// public sequence hash of the local block hashes we compute from the
// tokens each BlockStored carries, so a prompt's sequence hashes look them
// up directly. Each (worker, dp_rank) keeps a map from the engine's opaque
// block hash to our key, reference-counted because an engine can store the
// same hash twice.
//
// It implements selection.Indexer. Events of one rank must be applied in
// order (one listener goroutine per rank does); lookups run concurrently.
//
// Memory: a block held by one rank costs a node (56 bytes, from slabs), a
// pointer slot in the node map and an inline slot in the rank's map, and
// with a bound an eviction queue item; each further rank holding it adds
// a 16-byte holder and a map slot. BytesPerEntry is the measured figure
// (BenchmarkIndexMemory) and EntriesForMemory turns a budget into
// MaxEntries.
//
// MaxEntries caps the (block, rank) entries: a store that finds the index
// full is still indexed, and the oldest entries (by store time, over all
// partitions) are evicted to make room. Engines evict and report blocks
// as their caches fill, so the cap is a safety net against a misbehaving
// publisher or a fleet larger than the budget, not the normal way out;
// when it is reached, new blocks (the ones the next turn of a session
// asks for) win over old ones.
type Index struct {
	mu    sync.RWMutex
	parts map[selection.PartitionKey]*tree

	// MaxEntries bounds the (block, rank) entries over all partitions; 0
	// means no bound. Set it before use: the eviction queue only records
	// entries stored while a bound is set.
	MaxEntries int64
	entries    atomic.Int64
	// stamps numbers stored entries, for eviction order and to tell a
	// queued entry from a later one under the same engine hash.
	stamps atomic.Uint32
	// released counts entries dropped in bulk (cleared ranks, removed
	// workers) since memory was last handed back to the OS.
	released atomic.Int64

	// counters are reported through Counts (stats.go).
	counters indexCounters
}

// tree is one partition's index.
type tree struct {
	mu        sync.RWMutex
	blockSize int
	eagle     bool
	nodes     map[uint64]*node
	ranks     map[selection.Rank]map[uint64]entry // engine hash → entry
	// rankIDs numbers the ranks densely, so holders store 4 bytes and a
	// lookup keeps per-rank state in a slice instead of a map.
	rankIDs  map[selection.Rank]uint32
	rankList []selection.Rank
	slab     []node
	spare    []*node
	// live counts the tree's entries; queue orders them for eviction.
	live  int
	queue evictQueue
	// peaks remember the largest size of the node map and of each rank's
	// map since they were last rebuilt: Go maps never shrink.
	nodesPeak int
	rankPeaks []int    // by rank id
	shrink    []uint32 // ranks whose map fell to half its peak
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
	n := t.nodes[key]
	if n == nil {
		n = t.newNode()
		n.local, n.parent, n.root = local, prefix, !have
		t.nodes[key] = n
		t.nodesPeak = max(t.nodesPeak, len(t.nodes))
	}
	return key, n
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
	delete(t.nodes, key)
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

// New returns an empty index.
func New() *Index { return &Index{parts: make(map[selection.PartitionKey]*tree)} }

// ConfigurePartition sets a partition's block size and Eagle mode; events
// are hashed with them. Changing them drops the partition's content.
func (x *Index) ConfigurePartition(p selection.PartitionKey, blockSize int, eagle bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if t := x.parts[p]; t != nil {
		if t.blockSize == blockSize && t.eagle == eagle {
			return
		}
		t.mu.Lock()
		for r := range t.ranks {
			x.entries.Add(-int64(len(t.ranks[r])))
			x.released.Add(int64(len(t.ranks[r])))
		}
		t.mu.Unlock()
		defer x.releaseMemory()
	}
	x.parts[p] = &tree{blockSize: blockSize, eagle: eagle, nodes: map[uint64]*node{},
		ranks: map[selection.Rank]map[uint64]entry{}, rankIDs: map[selection.Rank]uint32{}}
}

func (x *Index) tree(p selection.PartitionKey) *tree {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.parts[p]
}

// ErrUnknownParent is returned when a store's parent is not indexed for
// its rank: the store is dropped (never re-rooted), which is the symptom
// that calls for a replay.
var ErrUnknownParent = errors.New("parent block not indexed for this rank")

// ErrTokenCount is returned when a store's token ids do not fill exactly
// its blocks: engines publish full blocks only, so the event is malformed,
// and storing the blocks its tokens do cover would index a guess.
var ErrTokenCount = errors.New("token ids do not match the stored blocks")

// Apply applies one decoded event for a rank of partition p.
func (x *Index) Apply(p selection.PartitionKey, r selection.Rank, ev *Event) error {
	t := x.tree(p)
	if t == nil {
		return fmt.Errorf("partition %s is not configured", p)
	}
	if ev.Skip {
		x.counters.skipped.add(1)
		return nil
	}
	t.mu.Lock()
	err := t.apply(x, r, ev)
	t.tidy(x)
	t.mu.Unlock()
	x.evictOver()
	x.releaseMemory()
	return err
}

func (t *tree) apply(x *Index, r selection.Rank, ev *Event) error {
	switch ev.Kind {
	case Stored:
		if err := t.store(x, r, ev); err != nil {
			return err
		}
	case Removed:
		m := t.ranks[r]
		for _, h := range ev.BlockHashes {
			if !t.remove(x, r, m, h) {
				x.counters.unknownBlock.add(1)
			}
		}
	case Cleared:
		t.clearRank(x, r)
	}
	x.counters.applied.add(1)
	return nil
}

var localsPool = sync.Pool{New: func() any { s := make([]uint64, 0, 256); return &s }}

func (t *tree) store(x *Index, r selection.Rank, ev *Event) error {
	m := t.ranks[r]
	var parentKey uint64
	if ev.HasParent {
		e, ok := m[ev.ParentHash]
		if !ok {
			x.counters.unknownParent.add(1)
			return ErrUnknownParent
		}
		parentKey = e.key
	}
	// Engine blocks of ebs tokens (ours when the event gives no size).
	ebs := ev.BlockSize
	if ebs <= 0 {
		ebs = t.blockSize
	}
	if len(ev.TokenIDs) != len(ev.BlockHashes)*ebs {
		x.counters.tokenCount.add(1)
		return ErrTokenCount
	}
	if m == nil {
		m = make(map[uint64]entry)
		t.ranks[r] = m
	}
	id := t.rankID(r)
	lp := localsPool.Get().(*[]uint64)
	defer localsPool.Put(lp)
	opt := selection.HashOptions{Seed: selection.SaltedSeed(ev.LoraName, ev.CacheSalt), Eagle: ev.Eagle || t.eagle}
	locals := selection.AppendBlockHashes((*lp)[:0], ev.TokenIDs, t.blockSize, opt)
	*lp = locals
	// Engine block i ends at token (i+1)·ebs; it maps to our last full
	// block ending there (the same block when the sizes agree).
	key, have := parentKey, ev.HasParent
	next := 0 // our blocks chained so far
	var span []*node
	for i, h := range ev.BlockHashes {
		ours := min((i+1)*ebs/t.blockSize, len(locals))
		span = span[:0]
		for ; next < ours; next++ {
			var n *node
			key, n = t.extend(key, have, locals[next])
			have = true
			span = append(span, n)
		}
		if len(span) == 0 {
			continue // the engine block ends inside one of ours: nothing to map yet
		}
		t.hold(x, m, id, span, key, h, ev.Tier)
	}
	return nil
}

// hold records that the rank (id, engine map m) holds the blocks of span,
// the last of which is key, under the engine hash engine.
func (t *tree) hold(x *Index, m map[uint64]entry, id uint32, span []*node, key, engine uint64, tier Tier) {
	if e, ok := m[engine]; ok {
		if e.key == key && e.tier() == tier && e.refs < math.MaxUint16 {
			e.refs++ // the engine stored the same block twice
			m[engine] = e
		}
		// Otherwise the engine reused the hash for another block before
		// removing the first; the first mapping stands until it is removed.
		t.dropEmpty(span)
		return
	}
	e := entry{key: key, meta: uint32(tier), refs: 1, span: uint16(len(span))}
	if x.MaxEntries > 0 {
		if x.entries.Load() >= x.MaxEntries {
			x.counters.full.add(1) // stored all the same: Apply evicts the oldest once the lock is released
		}
		st := x.stamps.Add(1)
		e.meta |= st << 8
		t.queue.push(qitem{engine: engine, id: id, stamp: st})
	}
	x.entries.Add(1)
	t.live++
	m[engine] = e
	if id := int(id); len(m) > t.rankPeaks[id] {
		t.rankPeaks[id] = len(m)
	}
	for _, n := range span {
		if h := n.find(id, tier); h != nil {
			h.refs++
			continue
		}
		h := holder{engine: engine, id: id, refs: 1, tier: tier, used: true}
		if !n.first.used {
			n.first = h
		} else {
			if n.more == nil {
				n.more = new([]holder)
			}
			*n.more = append(*n.more, h)
		}
		n.fp ^= mixHolder(id, tier)
		n.nh++
	}
}

// dropEmpty frees the nodes of span that nobody holds (created for a store
// that was then refused).
func (t *tree) dropEmpty(span []*node) {
	for _, n := range span {
		if !n.first.used && len(n.extra()) == 0 {
			key := n.local
			if !n.root {
				key = selection.NextSequenceHash(n.parent, n.local)
			}
			t.freeNode(key, n)
		}
	}
}

// remove drops one reference of a rank's engine hash; false if unknown.
func (t *tree) remove(x *Index, r selection.Rank, m map[uint64]entry, engine uint64) bool {
	e, ok := m[engine]
	if !ok {
		return false
	}
	if e.refs--; e.refs > 0 {
		m[engine] = e
		return true
	}
	delete(m, engine)
	x.entries.Add(-1)
	t.live--
	id := t.rankIDs[r]
	t.noteShrink(id, m)
	t.unhold(id, e)
	return true
}

// unhold releases the blocks of an engine entry: its block and the span-1
// before it.
func (t *tree) unhold(id uint32, e entry) {
	key := e.key
	for range max(e.span, 1) {
		n := t.nodes[key]
		if n == nil {
			return
		}
		parent := n.parent
		if h := n.find(id, e.tier()); h != nil {
			if h.refs--; h.refs == 0 {
				n.fp ^= mixHolder(id, e.tier())
				n.nh--
				if n.drop(h) {
					t.freeNode(key, n)
				}
			}
		}
		key = parent
	}
}

// clearRank drops every entry of rank r and the rank's map itself (an
// emptied Go map keeps its buckets).
func (t *tree) clearRank(x *Index, r selection.Rank) {
	m, ok := t.ranks[r]
	if !ok {
		return
	}
	id := t.rankIDs[r]
	for _, e := range m {
		t.unhold(id, e) // each engine entry holds its blocks once
	}
	x.entries.Add(-int64(len(m)))
	x.released.Add(int64(len(m)))
	t.live -= len(m)
	t.rankPeaks[id] = 0
	delete(t.ranks, r)
}

// RemoveRank drops every block of one rank (a publisher restart).
func (x *Index) RemoveRank(p selection.PartitionKey, r selection.Rank) {
	if t := x.tree(p); t != nil {
		t.mu.Lock()
		t.clearRank(x, r)
		t.tidy(x)
		t.mu.Unlock()
		x.releaseMemory()
	}
}

// RemoveWorker implements selection.Indexer.
func (x *Index) RemoveWorker(p selection.PartitionKey, workerID uint64) {
	t := x.tree(p)
	if t == nil {
		return
	}
	t.mu.Lock()
	for r := range t.ranks {
		if r.WorkerID == workerID {
			t.clearRank(x, r)
		}
	}
	t.tidy(x)
	t.mu.Unlock()
	x.releaseMemory()
}

// Blocks returns how many (block, rank) entries a rank holds.
func (x *Index) Blocks(p selection.PartitionKey, r selection.Rank) int {
	t := x.tree(p)
	if t == nil {
		return 0
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.ranks[r])
}

// Entries returns the (block, rank) entries over all partitions.
func (x *Index) Entries() int64 { return x.entries.Load() }

var slotPool = sync.Pool{New: func() any { s := []int32{}; return &s }}

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
	start := len(out.List)
	n := t.nodes[blocks[0]] // the first key is the first block hash either way
	if n == nil {
		return
	}
	mark := x.MaxEntries > 0
	if mark {
		n.markUsed()
	}
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
	n.each(func(h *holder) {
		if slotOf[h.id] < 0 {
			slotOf[h.id] = int32(len(out.List) - start)
			ids = append(ids, h.id)
			out.List = append(out.List, selection.Match{Rank: t.rankList[h.id]})
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
	var prevNH uint16
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
	key := blocks[0]
	for depth := range blocks {
		if depth > 0 {
			if chain != nil {
				key = chain[depth]
			} else {
				key = selection.NextSequenceHash(key, blocks[depth])
			}
			if n = t.nodes[key]; n == nil {
				break
			}
			if mark {
				n.markUsed()
			}
			if n.fp == prevFP && n.nh == prevNH {
				repeat++
				continue
			}
			flush()
		}
		prevFP, prevNH = n.fp, n.nh
		for _, i := range alive {
			best[i] = 255
		}
		n.each(func(h *holder) {
			if i := slotOf[h.id]; i >= 0 && h.tier < best[i] {
				best[i] = h.tier
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

var tierNames = [...]string{Device: "device", Host: "host_pinned", Disk: "disk", External: "external"}

// LoadDump applies dumped events (ours or a peer's) to partition p, which
// must be configured. Events carry our local hashes, so no tokens are needed.
func (x *Index) LoadDump(p selection.PartitionKey, events []selection.RouterEvent) error {
	t := x.tree(p)
	if t == nil {
		return fmt.Errorf("partition %s is not configured", p)
	}
	t.mu.Lock()
	defer x.evictOver() // runs after the unlock below
	defer t.mu.Unlock()
	for _, ev := range events {
		r := selection.Rank{WorkerID: ev.WorkerID, DPRank: ev.Event.DPRank}
		tier := Device
		for i, name := range tierNames {
			if name == ev.StorageTier {
				tier = Tier(i)
			}
		}
		m := t.ranks[r]
		if m == nil {
			m = make(map[uint64]entry)
			t.ranks[r] = m
		}
		id := t.rankID(r)
		st := ev.Event.Data.Stored
		var key uint64
		have := false
		if st.ParentHash != nil {
			e, ok := m[*st.ParentHash]
			if !ok {
				x.counters.unknownParent.add(1)
				continue
			}
			key, have = e.key, true
		}
		for _, b := range st.Blocks {
			var n *node
			key, n = t.extend(key, have, b.TokensHash)
			have = true
			t.hold(x, m, id, []*node{n}, key, b.BlockHash, tier)
		}
	}
	return nil
}

// Interface guards
var (
	_ selection.Indexer      = (*Index)(nil)
	_ selection.ChainIndexer = (*Index)(nil)
)
