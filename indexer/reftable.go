package indexer

import (
	"math/bits"
	"math/rand/v2"
)

// refTable is the index's hash table from a 64-bit hash to a record or
// entry ref: open addressing with linear probing over one array of 4-byte
// slots (0 marks an empty slot). A slot's key is read through the tree:
// the record's chain key in the node table, the entry's engine hash in a
// rank's table (engines set). A slot costs 4 bytes where a (key, value)
// slot cost 16 or 24 and a Go map's more.
//
// Go's maps cost the steady-state ingest two probes where one would do
// (a lookup, then an assignment or a delete, for each of a block's node
// and engine entries) and hash every key again; here claim finds or
// claims a key's slot in one probe. Keys are hashes, some chosen by
// publishers (engine block hashes), so the slot comes from the key mixed
// with a per-table random seed: a publisher cannot aim keys at one run of
// slots without knowing it. The load stays at most 3/4 (the table doubles
// past it), so a probe run stays short on average. Deletion shifts the
// later keys of a run back into the hole, so an engine's churn of stores
// and removals leaves no tombstones.
//
// A slot also keeps how far it sits from its key's home slot (its top
// distBits bits; distSat means that far or farther): a probe then reads
// the record of a slot only when the slot shares the key's home, and a
// deletion finds the home of the slots it moves back without reading
// their records and mixing their keys again. Refs leave those bits free:
// they are at most refBits wide (see maxIndex).
type refTable struct {
	slots []uint32
	n     int
	shift uint8
	seed  uint64
	// tree holds the records the refs name; engines tells the two kinds of
	// table apart (a branch, where a func value's call could not be inlined).
	tree    *tree
	engines bool
	// rank is an engine table's rank id (tree.rankIDs), kept here so an
	// event finds its rank's table and id in one map lookup.
	rank uint32
}

// The layout of a slot: the ref in the low refBits, the distance from its
// home above.
const (
	refBits   = 28
	refMask   = 1<<refBits - 1
	distSat   = 1<<(32-refBits) - 1
	distShift = refBits
)

// tableMinSlots is the smallest array a table allocates.
const tableMinSlots = 8

// slotsFor is the power of two that holds n keys at a load of 3/4 at most.
func slotsFor(n int) int {
	s := tableMinSlots
	for s*3/4 < n {
		s *= 2
	}
	return s
}

// newRefTable returns a table sized for n keys without growing.
func newRefTable(n int, tr *tree, engines bool) *refTable {
	t := &refTable{seed: rand.Uint64() | 1, tree: tr, engines: engines}
	t.alloc(slotsFor(n))
	return t
}

func (t *refTable) alloc(slots int) {
	t.slots = make([]uint32, slots)
	t.shift = uint8(64 - bits.TrailingZeros(uint(slots)))
}

// keyOf returns the key of a ref.
func (t *refTable) keyOf(r uint32) uint64 {
	if !t.engines {
		return t.tree.recs.at(r).key
	}
	if r&extBit != 0 {
		return t.tree.exts.at(r &^ extBit).engine
	}
	return t.tree.recs.at(r).engine
}

// home is key's first slot: the key mixed with the seed (the finalizer
// of splitmix64), its top bits.
func (t *refTable) home(key uint64) int {
	z := key ^ t.seed
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return int((z ^ z>>31) >> t.shift)
}

// slotOf packs ref for slot i whose key's home is h.
func (t *refTable) slotOf(ref uint32, i, h int) uint32 {
	d := uint32((i - h) & (len(t.slots) - 1))
	return ref | min(d, distSat)<<distShift
}

// Len returns how many keys the table holds.
func (t *refTable) Len() int {
	if t == nil {
		return 0
	}
	return t.n
}

// find returns key's slot index and whether it is held; when not, the
// index is the empty slot ending its probe run.
func (t *refTable) find(key uint64) (int, bool) { return t.findFrom(t.home(key), key) }

// findFrom is find with key's home h already known.
func (t *refTable) findFrom(h int, key uint64) (int, bool) {
	mask := len(t.slots) - 1
	for i, d := h, uint32(0); ; i, d = (i+1)&mask, d+1 {
		s := t.slots[i]
		if s == 0 {
			return i, false
		}
		if sd := s >> distShift; (sd == d || sd == distSat && d >= distSat) && t.keyOf(s&refMask) == key {
			return i, true
		}
	}
}

// get returns key's ref, or 0 when it is not held.
func (t *refTable) get(key uint64) uint32 {
	_, r := t.lookup(key)
	return r
}

// lookup returns key's slot index and ref, or (-1, 0) when it is not
// held; the index is for delAt.
func (t *refTable) lookup(key uint64) (int, uint32) {
	if t == nil || t.n == 0 {
		return -1, 0
	}
	if i, ok := t.find(key); ok {
		return i, t.slots[i] & refMask
	}
	return -1, 0
}

// claimed is a slot claim hands out: held, or to be filled.
type claimed struct {
	t    *refTable
	i    int
	home int // the key's home slot
	held bool
}

// ref returns the held slot's ref.
func (c claimed) ref() uint32 { return c.t.slots[c.i] & refMask }

// fill stores ref, whose key must be the claimed key, in a claimed empty
// slot.
func (c claimed) fill(ref uint32) { c.t.slots[c.i] = c.t.slotOf(ref, c.i, c.home) }

// claim finds key's slot, or claims an empty one for it. The caller must
// fill a claimed slot before the table is used again.
func (t *refTable) claim(key uint64) claimed {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.resize(max(2*len(t.slots), tableMinSlots))
	}
	return t.claimAt(t.home(key), len(t.slots), key)
}

// reserve grows the table, if need be, so that n more keys fit without
// growing: homes computed after it stay valid for claimAt while at most n
// keys are claimed.
func (t *refTable) reserve(n int) {
	if (t.n+n)*4 > len(t.slots)*3 {
		t.resize(max(2*len(t.slots), slotsFor(t.n+n)))
	}
}

// claimAt is claim with key's home h already known, computed when the
// table had slots slots (after a reserve that made room for this claim).
// A claim past that room grows the table, and a home computed before a
// growth is found again, so a miscounted reserve costs time, not
// correctness. (A table is only replaced whole, rebuilt, between events.)
func (t *refTable) claimAt(h, slots int, key uint64) claimed {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.resize(max(2*len(t.slots), tableMinSlots))
	}
	if slots != len(t.slots) {
		h = t.home(key)
	}
	i, held := t.findFrom(h, key)
	if !held {
		t.n++
	}
	return claimed{t: t, i: i, home: h, held: held}
}

// del removes key; false when it was not held. Later keys of its probe
// run move back into the hole unless their home lies cyclically in
// (hole, their slot].
func (t *refTable) del(key uint64) bool {
	if t == nil || t.n == 0 {
		return false
	}
	i, ok := t.find(key)
	if ok {
		t.delAt(i)
	}
	return ok
}

// delRef removes ref, held under key; false when it was not held. The
// probe compares refs, not keys, so it reads no record: the node table
// names each record once.
func (t *refTable) delRef(key uint64, ref uint32) bool {
	if t == nil || t.n == 0 {
		return false
	}
	return t.delRefFrom(t.home(key), ref)
}

// delRefFrom is delRef with the key's home h already known.
func (t *refTable) delRefFrom(h int, ref uint32) bool {
	mask := len(t.slots) - 1
	for i := h; ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == 0 {
			return false
		}
		if s&refMask == ref {
			t.delAt(i)
			return true
		}
	}
}

// delAt empties slot i (from lookup, the table unchanged since). A later
// slot of the run moves back into the hole when its distance from its
// home is at least its distance from the hole (its home is then not
// cyclically in (hole, slot]); the distance bits say so without reading
// its record, except for a slot at distSat or farther.
func (t *refTable) delAt(i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := t.slots[j]
		if s == 0 {
			break
		}
		gap := (j - i) & mask
		d := int(s >> distShift)
		if d == distSat {
			d = (j - t.home(t.keyOf(s&refMask))) & mask
		}
		if d >= gap {
			t.slots[i] = s&refMask | uint32(min(d-gap, distSat))<<distShift
			i = j
		}
	}
	t.slots[i] = 0
	t.n--
}

// resize moves every ref into an array of slots slots.
func (t *refTable) resize(slots int) {
	old := t.slots
	t.alloc(slots)
	t.insertAll(old)
}

// insertAll places the refs of old slots (the table holding none).
func (t *refTable) insertAll(old []uint32) {
	mask := len(t.slots) - 1
	for _, s := range old {
		if s == 0 {
			continue
		}
		r := s & refMask
		h := t.home(t.keyOf(r))
		i := h
		for t.slots[i] != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = t.slotOf(r, i, h)
	}
}

// rebuilt returns a right-sized copy of the table (the table itself never
// shrinks).
func (t *refTable) rebuilt() *refTable {
	fresh := newRefTable(t.n, t.tree, t.engines)
	fresh.rank = t.rank
	fresh.insertAll(t.slots)
	fresh.n = t.n
	return fresh
}

// each calls fn on every ref; the table must not change meanwhile.
func (t *refTable) each(fn func(ref uint32)) {
	for _, s := range t.slots {
		if s != 0 {
			fn(s & refMask)
		}
	}
}

// renumber replaces every ref r by to(r) in place (a slab rebuild: the
// keys, and so the slots, stay).
func (t *refTable) renumber(to func(ref uint32) uint32) {
	for i, s := range t.slots {
		if s != 0 {
			t.slots[i] = s&^refMask | to(s&refMask)
		}
	}
}
