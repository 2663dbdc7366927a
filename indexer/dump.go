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
// truncated is true when the partition held more, or when the walk
// visited dumpVisitsPerEvent unreplayable records per event allowed
// without finishing. Parents come before their children, so a truncated dump
// still loads whole. The tree's read lock is held while collecting only;
// besides the events, the walk keeps two bits per record of the
// partition.
func (x *Index) DumpLimit(p selection.PartitionKey, limit int) (events []selection.RouterEvent, truncated bool) {
	t := x.tree(p)
	if t == nil {
		return nil, false
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	d := dumper{t: t, limit: limit, visits: -1, seen: newRecordBits(t.recs.next), rooted: newRecordBits(t.recs.next)}
	if limit > 0 {
		d.visits = dumpVisitsPerEvent * limit
	}
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
	t      *tree
	limit  int
	visits int // unreplayable records the walk may still visit; -1: no bound
	out    []selection.RouterEvent
	// seen marks the records visited, and rooted those of them whose
	// ancestors reach a root (emitted). Bits, where a map of visited
	// records cost about 300 ns a record: a partition whose 2M blocks
	// none could be replayed held its read lock 0.7 s a dump.
	seen, rooted recordBits
	chain        []uint32
}

// dumpVisitsPerEvent bounds a capped dump's walk: at most this many
// records that cannot be replayed (their ancestors do not reach a root)
// visited per event it may emit. Replayable records are emitted and
// count against the event cap instead; unreplayable ones emit nothing,
// and a partition of them was walked whole under the read lock: 38 ms
// for 2M such blocks, about 150 ms (extrapolated) at the default budget's
// 7.5M. Past the bound the dump stops, marked truncated: at the default
// cap, after 400,000 such records (and the rest of the chain that passed
// it).
const dumpVisitsPerEvent = 4

// recordBits is a bit per record index of a tree.
type recordBits []uint64

func newRecordBits(records uint32) recordBits { return make(recordBits, (uint64(records)+63)/64) }

func (b recordBits) has(rec uint32) bool { return b[rec/64]&(1<<(rec%64)) != 0 }

func (b recordBits) set(rec uint32) { b[rec/64] |= 1 << (rec % 64) }

// visit emits block rec and its missing ancestors, root first; it returns
// false once the limit stopped it. A block whose ancestors do not reach a
// root (a parent was removed before its child) is not replayable and is
// skipped, as its descendants are.
func (d *dumper) visit(rec uint32) bool {
	d.chain = d.chain[:0]
	rooted := true
	for {
		if d.seen.has(rec) {
			rooted = d.rooted.has(rec)
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
	if !rooted && d.visits > 0 {
		// Blocks walked that cannot be replayed are what the bound
		// counts: a replayable chain's blocks are emitted.
		if d.visits -= len(d.chain); d.visits <= 0 {
			return false // the walk's bound: stop, truncated
		}
	}
	for i := len(d.chain) - 1; i >= 0; i-- {
		r := d.chain[i]
		d.seen.set(r)
		if rooted {
			d.rooted.set(r)
		}
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
