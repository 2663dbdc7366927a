package indexer

import (
	"errors"
	"fmt"
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
type Index struct {
	mu    sync.RWMutex
	parts map[selection.PartitionKey]*tree

	// Counters, for metrics.
	Applied       atomic.Uint64 // events applied
	Skipped       atomic.Uint64 // events ignored by rule (other group, medium)
	UnknownParent atomic.Uint64 // stores dropped: parent hash not indexed for the rank
	UnknownBlock  atomic.Uint64 // removals of hashes the rank does not hold
}

// tree is one partition's index.
type tree struct {
	mu        sync.RWMutex
	blockSize int
	eagle     bool
	nodes     map[uint64]*node
	ranks     map[selection.Rank]map[uint64]*entry // engine hash → entry
	// rankIDs numbers the ranks densely, so a lookup can keep per-rank
	// state in a slice instead of a map.
	rankIDs map[selection.Rank]uint32
}

func (t *tree) rankID(r selection.Rank) uint32 {
	id, ok := t.rankIDs[r]
	if !ok {
		id = uint32(len(t.rankIDs))
		t.rankIDs[r] = id
	}
	return id
}

// node is one block: a prefix of some prompt.
type node struct {
	local, parent uint64 // our local hash; the parent's chain key
	root          bool
	holders       []holder
}

// holder is one rank's copy of a block in one tier.
type holder struct {
	id     uint32 // tree.rankIDs[rank]
	rank   selection.Rank
	tier   Tier
	refs   uint32
	engine uint64 // the rank's engine hash for it (for dumps)
}

// entry maps one engine hash of a rank to our block.
type entry struct {
	key  uint64
	tier Tier
	refs uint32
}

// New returns an empty index.
func New() *Index { return &Index{parts: make(map[selection.PartitionKey]*tree)} }

// ConfigurePartition sets a partition's block size and Eagle mode; events
// are hashed with them. Changing them drops the partition's content.
func (x *Index) ConfigurePartition(p selection.PartitionKey, blockSize int, eagle bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if t := x.parts[p]; t != nil && t.blockSize == blockSize && t.eagle == eagle {
		return
	}
	x.parts[p] = &tree{blockSize: blockSize, eagle: eagle, nodes: map[uint64]*node{},
		ranks: map[selection.Rank]map[uint64]*entry{}, rankIDs: map[selection.Rank]uint32{}}
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

// Apply applies one decoded event for a rank of partition p.
func (x *Index) Apply(p selection.PartitionKey, r selection.Rank, ev *Event) error {
	t := x.tree(p)
	if t == nil {
		return fmt.Errorf("partition %s is not configured", p)
	}
	if ev.Skip {
		x.Skipped.Add(1)
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch ev.Kind {
	case Stored:
		if err := t.store(x, r, ev); err != nil {
			return err
		}
	case Removed:
		for _, h := range ev.BlockHashes {
			if !t.remove(r, h) {
				x.UnknownBlock.Add(1)
			}
		}
	case Cleared:
		t.clearRank(r)
	}
	x.Applied.Add(1)
	return nil
}

var localsPool = sync.Pool{New: func() any { s := make([]uint64, 0, 256); return &s }}

func (t *tree) store(x *Index, r selection.Rank, ev *Event) error {
	var parentKey uint64
	if ev.HasParent {
		e := t.ranks[r][ev.ParentHash]
		if e == nil {
			x.UnknownParent.Add(1)
			return ErrUnknownParent
		}
		parentKey = e.key
	}
	lp := localsPool.Get().(*[]uint64)
	defer localsPool.Put(lp)
	opt := selection.HashOptions{Seed: selection.SaltedSeed(ev.LoraName, ev.CacheSalt), Eagle: ev.Eagle || t.eagle}
	locals := selection.AppendBlockHashes((*lp)[:0], ev.TokenIDs, t.blockSize, opt)
	*lp = locals
	// Engine block i ends at token (i+1)·engineBlockSize; it maps to our
	// last full block ending there (the same block when the sizes agree).
	ebs := ev.BlockSize
	if ebs <= 0 {
		ebs = t.blockSize
	}
	key, have := parentKey, ev.HasParent
	next := 0 // our blocks chained so far
	for i, h := range ev.BlockHashes {
		ours := min((i+1)*ebs/t.blockSize, len(locals))
		for ; next < ours; next++ {
			parent, root := key, !have
			if have {
				key = selection.NextSequenceHash(key, locals[next])
			} else {
				key, have = locals[next], true
			}
			if t.nodes[key] == nil {
				t.nodes[key] = &node{local: locals[next], parent: parent, root: root}
			}
		}
		if next == 0 {
			continue // a partial block of ours: nothing to map yet
		}
		t.hold(r, key, h, ev.Tier)
	}
	return nil
}

func (t *tree) hold(r selection.Rank, key, engine uint64, tier Tier) {
	m := t.ranks[r]
	if m == nil {
		m = make(map[uint64]*entry)
		t.ranks[r] = m
	}
	if e := m[engine]; e != nil {
		if e.key == key && e.tier == tier {
			e.refs++
		}
		// A reused engine hash for another block: the newer store wins
		// only once the older copies are removed; keep the count honest.
		return
	}
	m[engine] = &entry{key: key, tier: tier, refs: 1}
	n := t.nodes[key]
	for i := range n.holders {
		if h := &n.holders[i]; h.rank == r && h.tier == tier {
			h.refs++
			return
		}
	}
	n.holders = append(n.holders, holder{id: t.rankID(r), rank: r, tier: tier, refs: 1, engine: engine})
}

// remove drops one reference of a rank's engine hash; false if unknown.
func (t *tree) remove(r selection.Rank, engine uint64) bool {
	m := t.ranks[r]
	e := m[engine]
	if e == nil {
		return false
	}
	e.refs--
	if e.refs > 0 {
		return true
	}
	delete(m, engine)
	t.unhold(r, e.key, e.tier)
	return true
}

func (t *tree) unhold(r selection.Rank, key uint64, tier Tier) {
	n := t.nodes[key]
	if n == nil {
		return
	}
	for i := range n.holders {
		if h := &n.holders[i]; h.rank == r && h.tier == tier {
			if h.refs--; h.refs == 0 {
				n.holders[i] = n.holders[len(n.holders)-1]
				n.holders = n.holders[:len(n.holders)-1]
			}
			break
		}
	}
	if len(n.holders) == 0 {
		delete(t.nodes, key)
	}
}

func (t *tree) clearRank(r selection.Rank) {
	for _, e := range t.ranks[r] {
		t.unhold(r, e.key, e.tier) // each engine entry holds its block once
	}
	delete(t.ranks, r)
}

// RemoveRank drops every block of one rank (a publisher restart).
func (x *Index) RemoveRank(p selection.PartitionKey, r selection.Rank) {
	if t := x.tree(p); t != nil {
		t.mu.Lock()
		t.clearRank(r)
		t.mu.Unlock()
	}
}

// RemoveWorker implements selection.Indexer.
func (x *Index) RemoveWorker(p selection.PartitionKey, workerID uint64) {
	t := x.tree(p)
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for r := range t.ranks {
		if r.WorkerID == workerID {
			t.clearRank(r)
		}
	}
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

// FindMatches implements selection.Indexer. A rank's device depth is its
// prefix run in the device tier; its host depth continues that run through
// blocks it holds in the host tier, and its disk depth continues through
// disk or external blocks, each block counted once in its best tier.
func (x *Index) FindMatches(p selection.PartitionKey, blocks []uint64, out *selection.Matches) {
	t := x.tree(p)
	if t == nil || len(blocks) == 0 {
		return
	}
	kp := localsPool.Get().(*[]uint64)
	defer localsPool.Put(kp)
	keys := selection.AppendSequenceHashes((*kp)[:0], blocks)
	*kp = keys
	t.mu.RLock()
	defer t.mu.RUnlock()
	start := len(out.List)
	n := t.nodes[keys[0]]
	if n == nil {
		return
	}
	// One slot per rank holding the first block; only they can match.
	sp := slotPool.Get().(*[]int32)
	defer slotPool.Put(sp)
	slotOf := *sp
	if len(slotOf) < len(t.rankIDs) {
		slotOf = make([]int32, len(t.rankIDs))
		for i := range slotOf {
			slotOf[i] = -1
		}
		*sp = slotOf
	}
	for _, h := range n.holders {
		if slotOf[h.id] < 0 {
			slotOf[h.id] = int32(len(out.List) - start)
			out.List = append(out.List, selection.Match{Rank: h.rank})
		}
	}
	defer func() {
		for _, m := range out.List[start:] {
			slotOf[t.rankIDs[m.Rank]] = -1
		}
	}()
	ranks := len(out.List) - start
	phase := make([]uint8, ranks) // 0 device run, 1 host continuation, 2 disk, 3 done
	best := make([]Tier, ranks)
	alive := make([]int32, ranks) // slots still matching
	for i := range alive {
		alive[i] = int32(i)
	}
	for depth, key := range keys {
		if depth > 0 {
			if n = t.nodes[key]; n == nil {
				break
			}
		}
		for _, i := range alive {
			best[i] = 255
		}
		for _, h := range n.holders {
			if i := slotOf[h.id]; i >= 0 && h.tier < best[i] {
				best[i] = h.tier
			}
		}
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
			break
		}
	}
}

var slotPool = sync.Pool{New: func() any { s := []int32{}; return &s }}

// Dump implements selection.Indexer: one single-block Stored event per
// (block, rank, tier), parents before children, with the rank's engine
// hashes, so LoadDump (or a peer) rebuilds the same index.
func (x *Index) Dump(p selection.PartitionKey) []selection.RouterEvent {
	t := x.tree(p)
	if t == nil {
		return nil
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	children := make(map[uint64][]uint64, len(t.nodes))
	var queue []uint64
	for k, n := range t.nodes {
		if n.root {
			queue = append(queue, k)
		} else {
			children[n.parent] = append(children[n.parent], k)
		}
	}
	var out []selection.RouterEvent
	for len(queue) > 0 {
		k := queue[0]
		queue = queue[1:]
		n := t.nodes[k]
		for _, h := range n.holders {
			var parent *uint64
			if !n.root {
				if pn := t.nodes[n.parent]; pn != nil {
					for _, ph := range pn.holders {
						if ph.rank == h.rank {
							v := ph.engine
							parent = &v
							break
						}
					}
				}
				if parent == nil {
					continue // the rank holds this block but not its parent: not replayable
				}
			}
			out = append(out, selection.RouterEvent{WorkerID: h.rank.WorkerID, StorageTier: tierNames[h.tier],
				Event: selection.KVEvent{EventID: uint64(len(out)), DPRank: h.rank.DPRank,
					Data: selection.StoredData{Stored: selection.StoredEvent{ParentHash: parent,
						Blocks: []selection.StoredBlock{{BlockHash: h.engine, TokensHash: n.local}}}}}})
		}
		queue = append(queue, children[k]...)
	}
	return out
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
	defer t.mu.Unlock()
	for _, ev := range events {
		r := selection.Rank{WorkerID: ev.WorkerID, DPRank: ev.Event.DPRank}
		tier := Device
		for i, name := range tierNames {
			if name == ev.StorageTier {
				tier = Tier(i)
			}
		}
		st := ev.Event.Data.Stored
		var key uint64
		have := false
		if st.ParentHash != nil {
			e := t.ranks[r][*st.ParentHash]
			if e == nil {
				x.UnknownParent.Add(1)
				continue
			}
			key, have = e.key, true
		}
		for _, b := range st.Blocks {
			parent, root := key, !have
			if have {
				key = selection.NextSequenceHash(key, b.TokensHash)
			} else {
				key, have = b.TokensHash, true
			}
			if t.nodes[key] == nil {
				t.nodes[key] = &node{local: b.TokensHash, parent: parent, root: root}
			}
			t.hold(r, key, b.BlockHash, tier)
		}
	}
	return nil
}

// Interface guard.
var _ selection.Indexer = (*Index)(nil)
