package indexer

import (
	"math/bits"
	"runtime"
	"slices"
)

// Reading ahead of a payload's probes. A probe's loads wait on each
// other (the slot names a record, the record holds the key), and on a
// fleet's index the slots and records are cache misses: at 1,024 workers
// and 1M entries, BenchmarkIngestFleetZMQ's profile put a third of
// ingest's CPU in those waits. The keys of one event are known up front,
// so their home buckets (and what those name) are read first, in passes
// whose loads do not wait on each other; the probes that follow then find
// them in cache. The hashes computed there are kept for the probes, so
// reading ahead costs the loads and not the hashing twice.

// warmMinRecords is the tree size from which a store's probes read the
// records their home buckets' matching tags name ahead as well. In a
// smaller tree the records mostly stay in the core's caches between
// payloads and reading them ahead cost more than it saved (BenchmarkDecodeApply, one engine's
// 8-16k blocks: 5-6 % more CPU); only the home buckets are read ahead
// there, which the tables' random homes still miss. 1<<16 records are
// 2.5 MB, past a core's L2. A removal reads its entries ahead at any size:
// that pass finds them, and the removals start from what it found.
const warmMinRecords = 1 << 16

// cold reports whether the tree is large enough for its payloads' probes
// to miss the caches on records too, so that warming them pays.
func (t *tree) cold() bool { return t.recs.used >= warmMinRecords }

// hashesOf appends the hash of each key to dst and reads the keys' home
// buckets, and with records the keys of the refs whose tags match there
// too (the first of them: nearly always the only one). What it read is
// summed and kept alive, so the compiler keeps the loads.
func (t *refTable) hashesOf(dst []uint64, keys []uint64, records bool) []uint64 {
	start := len(dst)
	dst = slices.Grow(dst, len(keys))[:start+len(keys)]
	seen := t.hashHomes(keys, dst[start:])
	if records && t.n > 0 {
		for _, h := range dst[start:] {
			seen += t.firstMatchKey(h)
		}
	}
	runtime.KeepAlive(seen)
	return dst
}

// hashHomes sets hashes[i] to the hash of keys[i] and reads each key's
// home bucket; it returns the sum of what it read, for the caller's
// runtime.KeepAlive (so the compiler keeps the loads).
func (t *refTable) hashHomes(keys, hashes []uint64) uint64 {
	seen := uint64(0)
	for i, k := range keys {
		h := t.hashOf(k)
		hashes[i] = h
		seen += t.buckets[t.homeOf(h)].lo
	}
	return seen
}

// firstMatchKey reads the key of the first slot in hash h's home bucket
// whose tag is h's (0 when none is).
func (t *refTable) firstMatchKey(h uint64) uint64 {
	bk := &t.buckets[t.homeOf(h)]
	lo, hi := bk.matches(broadcast(tagOf(h)))
	switch {
	case lo != 0:
		return t.keyOf(bk.refs[bits.TrailingZeros64(lo)>>3])
	case hi != 0:
		return t.keyOf(bk.refs[8+bits.TrailingZeros64(hi)>>3])
	}
	return 0
}

// resolve finds each key of keys (at most aheadMax) and sets refs[i] to
// keys[i]'s ref (0: not held), in two passes: the keys' hashes and home
// buckets first, then the finds, which read the records the tags point
// at. No load of one key's find waits on another key's, so they overlap
// where a walk's one find at a time would wait on each miss in turn.
func (t *refTable) resolve(keys []uint64, refs []uint32) {
	var hashes [aheadMax]uint64
	runtime.KeepAlive(t.hashHomes(keys, hashes[:len(keys)]))
	for i, k := range keys {
		refs[i] = t.getAt(hashes[i], k)
	}
}

// aheadMax is how many keys one read-ahead pass covers: an event's keys go
// in chunks of it, so what a pass found fits in a fixed scratch
// (tree.ahead) whatever the event's size.
const aheadMax = 64

// removalAhead is what readAheadRemoval found for each engine hash of a
// chunk: its hash in the rank's table, the slot and entry that hold it
// (entry 0: not found), and the node-table hash of that entry's block (0:
// not an inline entry, or not known).
type removalAhead struct {
	engineHash [aheadMax]uint64
	slot       [aheadMax]int32
	entry      [aheadMax]uint32
	nodeHash   [aheadMax]uint64
}

// readAheadRemoval reads what removing engine hashes (at most aheadMax)
// of a rank (engine table m) reads, in three passes whose loads do not
// wait on each other: the engine table's home buckets, the entries those
// probes find (their records hold the engine hashes compared), then the
// node table's home buckets of those entries' blocks. A removal is a
// chain of three such loads, each a cache miss in an index larger than a
// core's caches; read one removal at a time, they wait one after another.
func (t *tree) readAheadRemoval(m *refTable, engines []uint64, a *removalAhead) {
	seen := m.hashHomes(engines, a.engineHash[:len(engines)])
	for k, e := range engines {
		i, held := m.findFrom(a.engineHash[k], e)
		a.slot[k], a.entry[k], a.nodeHash[k] = int32(i), 0, 0
		if !held {
			continue
		}
		ref := m.refAt(i)
		a.entry[k] = ref
		if ref&extBit == 0 {
			a.nodeHash[k] = t.nodes.hashOf(t.recs.at(ref).key)
		}
	}
	for k := range engines {
		if h := a.nodeHash[k]; h != 0 {
			seen += t.nodes.buckets[t.nodes.homeOf(h)].lo
		}
	}
	runtime.KeepAlive(seen)
}
