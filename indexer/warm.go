package indexer

import "runtime"

// Reading ahead of a payload's probes. A probe's loads wait on each
// other (the slot names a record, the record holds the key), and on a
// fleet's index the slots and records are cache misses: at 1,024 workers
// and 1M entries, BenchmarkIngestFleetZMQ's profile put a third of
// ingest's CPU in those waits. The keys of one event are known up front,
// so their home slots (and what those name) are read first, in passes
// whose loads do not wait on each other; the probes that follow then find
// them in cache. The homes computed there are kept for the probes, so
// reading ahead costs the loads and not the hashing twice.

// warmMinRecords is the tree size from which a store's probes read the
// records their home slots name ahead as well. In a smaller tree the
// records mostly stay in the core's caches between payloads and reading
// them ahead cost more than it saved (BenchmarkDecodeApply, one engine's
// 8-16k blocks: 5-6 % more CPU); only the home slots are read ahead
// there, which the tables' random homes still miss. 1<<16 records are
// 2.5 MB, past a core's L2. A removal reads its entries ahead at any size:
// that pass finds them, and the removals start from what it found.
const warmMinRecords = 1 << 16

// cold reports whether the tree is large enough for its payloads' probes
// to miss the caches on records too, so that warming them pays.
func (t *tree) cold() bool { return t.recs.used >= warmMinRecords }

// homesOf appends the home slot of each key to dst and reads those
// slots, and with records the keys of the refs they hold too. What it
// read is summed and kept alive, so the compiler keeps the loads.
func (t *refTable) homesOf(dst []int32, keys []uint64, records bool) []int32 {
	seen := uint32(0)
	start := len(dst)
	for _, k := range keys {
		h := t.home(k)
		dst = append(dst, int32(h))
		seen += t.slots[h]
	}
	if records && t.n > 0 {
		seen64 := uint64(0)
		for _, h := range dst[start:] {
			if s := t.slots[h]; s != 0 {
				seen64 += t.keyOf(s & refMask)
			}
		}
		seen += uint32(seen64)
	}
	runtime.KeepAlive(seen)
	return dst
}

// warm reads the home slot of each key and the key of the ref it holds.
// What it read is summed and kept alive, so the compiler keeps the loads.
func (t *refTable) warm(keys []uint64) {
	if t == nil || t.n == 0 {
		return
	}
	seen := uint64(0)
	for _, k := range keys {
		if s := t.slots[t.home(k)]; s != 0 {
			seen += t.keyOf(s & refMask)
		}
	}
	runtime.KeepAlive(seen)
}

// aheadMax is how many keys one read-ahead pass covers: an event's keys go
// in chunks of it, so what a pass found fits in a fixed scratch
// (tree.ahead) whatever the event's size.
const aheadMax = 64

// removalAhead is what readAheadRemoval found for each engine hash of a
// chunk: its home slot in the rank's table, the slot and entry that hold
// it (entry 0: not found), and the node-table home of that entry's block
// (-1: not an inline entry).
type removalAhead struct {
	engineHome [aheadMax]int32
	slot       [aheadMax]int32
	entry      [aheadMax]uint32
	nodeHome   [aheadMax]int32
}

// readAheadRemoval reads what removing engine hashes (at most aheadMax)
// of a rank (engine table m) reads, in three passes whose loads do not
// wait on each other: the engine table's home slots, the entries those
// probes find (their records hold the engine hashes compared), then the
// node table's home slots of those entries' blocks. A removal is a chain
// of three such loads, each a cache miss in an index larger than a core's
// caches; read one removal at a time, they wait one after another.
func (t *tree) readAheadRemoval(m *refTable, engines []uint64, a *removalAhead) {
	seen := uint32(0)
	for k, e := range engines {
		h := m.home(e)
		a.engineHome[k] = int32(h)
		seen += m.slots[h]
	}
	for k, e := range engines {
		i, held := m.findFrom(int(a.engineHome[k]), e)
		a.slot[k], a.entry[k], a.nodeHome[k] = int32(i), 0, -1
		if !held {
			continue
		}
		ref := m.slots[i] & refMask
		a.entry[k] = ref
		if ref&extBit == 0 {
			a.nodeHome[k] = int32(t.nodes.home(t.recs.at(ref).key))
		}
	}
	for k := range engines {
		if h := a.nodeHome[k]; h >= 0 {
			seen += t.nodes.slots[h]
		}
	}
	runtime.KeepAlive(seen)
}
