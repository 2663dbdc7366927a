package indexer

import "github.com/kvrouter/caddy-kvrouter/selection"

// Dump implements selection.Indexer: one single-block Stored event per
// (block, rank, tier), parents before children, with the rank's engine
// hashes, so a peer (or the tests' LoadDump) rebuilds the same index.
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
	d := dumper{t: t, limit: limit, seen: map[uint64]bool{}}
	for k, n := range t.nodes.All() {
		if !d.visit(k, n) {
			return d.out, true
		}
	}
	return d.out, false
}

// dumper collects a dump in one pass over the node table: each node is
// emitted after the chain of its ancestors not emitted yet, so no
// parent-to-children index of the whole tree is needed.
type dumper struct {
	t     *tree
	limit int
	out   []selection.RouterEvent
	seen  map[uint64]bool // visited blocks: emitted (true) or not rooted (false)
	chain []uint64
}

// visit emits the block at key and its missing ancestors, root first; it
// returns false once the limit stopped it. A block whose ancestors do not
// reach a root (a parent was removed before its child) is not replayable
// and is skipped, as its descendants are.
func (d *dumper) visit(key uint64, n *node) bool {
	d.chain = d.chain[:0]
	rooted := true
	for {
		if ok, seen := d.seen[key]; seen {
			rooted = ok
			break
		}
		d.chain = append(d.chain, key)
		if n.root {
			break
		}
		key = n.parent
		if n, _ = d.t.nodes.get(key); n == nil {
			rooted = false
			break
		}
	}
	for i := len(d.chain) - 1; i >= 0; i-- {
		k := d.chain[i]
		d.seen[k] = rooted
		if n, _ := d.t.nodes.get(k); rooted && !d.emit(n) {
			return false
		}
	}
	return true
}

// emit appends one event per holder of n whose rank also holds n's
// parent; false once the limit is reached with events left.
func (d *dumper) emit(n *node) bool {
	t := d.t
	full := false
	n.each(func(h *holder) {
		if full {
			return
		}
		var parent *uint64
		if !n.root {
			if pn, _ := t.nodes.get(n.parent); pn != nil {
				pn.each(func(ph *holder) {
					if parent == nil && ph.id == h.id {
						v := ph.engine
						parent = &v
					}
				})
			}
			if parent == nil {
				return // the rank holds this block but not its parent: not replayable
			}
		}
		if d.limit > 0 && len(d.out) >= d.limit {
			full = true
			return
		}
		r := t.rankList[h.id]
		d.out = append(d.out, selection.RouterEvent{WorkerID: r.WorkerID, StorageTier: tierNames[h.tier],
			Event: selection.KVEvent{EventID: uint64(len(d.out)), DPRank: r.DPRank,
				Data: selection.StoredData{Stored: selection.StoredEvent{ParentHash: parent,
					Blocks: []selection.StoredBlock{{BlockHash: h.engine, TokensHash: n.local}}}}}})
	})
	return !full
}

// tierNames are the storage tiers as dumps spell them.
var tierNames = [...]string{Device: "device", Host: "host_pinned", Disk: "disk", External: "external"}
