package indexer

import "runtime"

// Warming the tables before a payload's probes. A probe's loads wait on
// each other (the slot names a record, the record holds the key), and on
// a fleet's index the slots and records are cache misses: at 1,024
// workers and 1M entries, BenchmarkIngestFleetZMQ's profile put a third of
// ingest's CPU in those waits. The keys of one event are known up front,
// so their home slots and the records those name are read first, in one
// pass whose loads do not wait on each other; the probes that follow then
// find them in cache.

// warmMinRecords is the tree size from which a payload's probes are
// warmed whole (slots, the records they name, and for removals the node
// table's slots of those records' blocks). In a smaller tree the records
// mostly stay in the core's caches between payloads and reading them
// ahead cost more than it saved (BenchmarkDecodeApply, one engine's 8-16k
// blocks: 5-6 % more CPU); only the home slots are read ahead there
// (warmSlots), which the tables' random homes still miss. 1<<16 records
// are 2.5 MB, past a core's L2.
const warmMinRecords = 1 << 16

// cold reports whether the tree is large enough for its payloads' probes
// to miss the caches on records too, so that warming them pays.
func (t *tree) cold() bool { return t.recs.used >= warmMinRecords }

// warmSlots reads the home slot of each key, and nothing they name.
func (t *refTable) warmSlots(keys []uint64) {
	if t == nil || t.n == 0 {
		return
	}
	seen := uint32(0)
	for _, k := range keys {
		seen += t.slots[t.home(k)]
	}
	runtime.KeepAlive(seen)
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

// warmRemoval warms what removing engine hashes of a rank (engine table
// m) reads: the engine table's slots and the entries' records, then the
// node table's slots of those records' blocks.
func (t *tree) warmRemoval(m *refTable, engines []uint64) {
	if m == nil || m.n == 0 {
		return
	}
	seen := uint64(0)
	for _, k := range engines {
		s := m.slots[m.home(k)]
		if s == 0 || s&extBit != 0 {
			continue
		}
		if rec := t.recs.at(s & refMask); rec.engine == k {
			seen += uint64(t.nodes.slots[t.nodes.home(rec.key)])
		}
	}
	runtime.KeepAlive(seen)
}
