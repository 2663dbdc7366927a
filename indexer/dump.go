package indexer

import "github.com/kvrouter/caddy-kvrouter/selection"

// Dump implements selection.Indexer: one single-block Stored event per
// (block, rank, tier), parents before children, with the rank's engine
// hashes, so a peer (or LoadDump) rebuilds the same index.
func (x *Index) Dump(p selection.PartitionKey) []selection.RouterEvent {
	out, _ := x.DumpLimit(p, 0)
	return out
}

// DumpLimit is Dump with at most limit events (limit ≤ 0: no limit);
// truncated is true when the partition held more. Parents come before
// their children, so a truncated dump still loads whole. The tree's read
// lock is held while collecting only, and what it builds besides the
// events is bounded by the nodes it visits, not by the partition.
func (x *Index) DumpLimit(p selection.PartitionKey, limit int) (events []selection.RouterEvent, truncated bool) {
	t := x.tree(p)
	if t == nil {
		return nil, false
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	d := dumper{t: t, limit: limit, seen: map[uint32]bool{}}
	for rec := range t.nodes.refs() {
		if !d.visit(rec) {
			return d.out, true
		}
	}
	return d.out, false
}

// dumper collects a dump in one pass over the node table: each block is
// emitted after the chain of its ancestors not emitted yet, so no
// parent-to-children index of the whole tree is needed.
type dumper struct {
	t     *tree
	limit int
	out   []selection.RouterEvent
	seen  map[uint32]bool // visited records: emitted (true) or not rooted (false)
	chain []uint32
}

// visit emits block rec and its missing ancestors, root first; it returns
// false once the limit stopped it. A block whose ancestors do not reach a
// root (a parent was removed before its child) is not replayable and is
// skipped, as its descendants are.
func (d *dumper) visit(rec uint32) bool {
	d.chain = d.chain[:0]
	rooted := true
	for {
		if ok, seen := d.seen[rec]; seen {
			rooted = ok
			break
		}
		d.chain = append(d.chain, rec)
		if d.t.loadMeta(rec)&fRoot != 0 {
			break
		}
		if rec = d.t.parentOf(rec); rec == 0 {
			rooted = false
			break
		}
	}
	for i := len(d.chain) - 1; i >= 0; i-- {
		r := d.chain[i]
		d.seen[r] = rooted
		if rooted && !d.emit(r) {
			return false
		}
	}
	return true
}

// emit appends one event per holder of block rec whose rank also holds
// its parent; false once the limit is reached with events left.
func (d *dumper) emit(rec uint32) bool {
	t := d.t
	meta := t.loadMeta(rec)
	var parentRec, parentMeta uint32
	if meta&fRoot == 0 {
		parentRec = t.parentOf(rec)
		parentMeta = t.loadMeta(parentRec)
	}
	local := t.localOf(rec, meta)
	full := false
	t.eachHolder(rec, meta, func(id uint32, tier Tier, engine uint64) {
		if full {
			return
		}
		var parent *uint64
		if meta&fRoot == 0 {
			t.eachHolder(parentRec, parentMeta, func(pid uint32, _ Tier, pengine uint64) {
				if parent == nil && pid == id {
					v := pengine
					parent = &v
				}
			})
			if parent == nil {
				return // the rank holds this block but not its parent: not replayable
			}
		}
		if d.limit > 0 && len(d.out) >= d.limit {
			full = true
			return
		}
		r := t.rankList[id]
		d.out = append(d.out, selection.RouterEvent{WorkerID: r.WorkerID, StorageTier: tierNames[tier],
			Event: selection.KVEvent{EventID: uint64(len(d.out)), DPRank: r.DPRank,
				Data: selection.StoredData{Stored: selection.StoredEvent{ParentHash: parent,
					Blocks: []selection.StoredBlock{{BlockHash: engine, TokensHash: local}}}}}})
	})
	return !full
}

// tierNames are the storage tiers as dumps spell them.
var tierNames = [...]string{Device: "device", Host: "host_pinned", Disk: "disk", External: "external"}
