package indexer

import (
	"math/bits"
	"math/rand/v2"
)

// refTable is table.go's hash table with 4-byte slots: each slot holds a
// record or entry ref (0 marks an empty slot), and a slot's key is read
// through the tree: the record's chain key in the node table, the entry's
// engine hash in a rank's table (engines set).
// A slot costs 4 bytes where a (key, value) slot cost 16 or 24, at the
// price of a read of the record per probe; with linear probing at most
// 3/4 full, a lookup reads about two. Probing, the seeded slot choice and
// backward-shift deletion are table.go's (see there why).
//
// A pointer from claim is valid until the next claim, del or resize.
type refTable struct {
	slots []uint32
	n     int
	shift uint8
	seed  uint64
	// tree holds the records the refs name; engines tells the two kinds of
	// table apart (a branch, where a func value's call could not be inlined).
	tree    *tree
	engines bool
}

// keyOf returns the key of the ref in a slot.
func (t *refTable) keyOf(r uint32) uint64 {
	if !t.engines {
		return t.tree.recs.at(r).key
	}
	if r&extBit != 0 {
		return t.tree.exts.at(r &^ extBit).engine
	}
	return t.tree.recs.at(r).engine
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

// home is key's first slot (table.home's mix).
func (t *refTable) home(key uint64) int {
	z := key ^ t.seed
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return int((z ^ z>>31) >> t.shift)
}

// Len returns how many keys the table holds.
func (t *refTable) Len() int {
	if t == nil {
		return 0
	}
	return t.n
}

// get returns key's ref, or 0 when it is not held.
func (t *refTable) get(key uint64) uint32 {
	if t == nil || t.n == 0 {
		return 0
	}
	mask := len(t.slots) - 1
	for i := t.home(key); ; i = (i + 1) & mask {
		r := t.slots[i]
		if r == 0 {
			return 0
		}
		if t.keyOf(r) == key {
			return r
		}
	}
}

// claim returns key's slot, claiming an empty one for it when it is not
// held (held reports which). The caller must fill a claimed slot with a
// ref whose key is key before the table is used again.
func (t *refTable) claim(key uint64) (slot *uint32, held bool) {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.resize(max(2*len(t.slots), tableMinSlots))
	}
	mask := len(t.slots) - 1
	for i := t.home(key); ; i = (i + 1) & mask {
		r := t.slots[i]
		if r == 0 {
			t.n++
			return &t.slots[i], false
		}
		if t.keyOf(r) == key {
			return &t.slots[i], true
		}
	}
}

// del removes key; false when it was not held. Later keys of its probe
// run move back into the hole (table.del).
func (t *refTable) del(key uint64) bool {
	if t == nil || t.n == 0 {
		return false
	}
	mask := len(t.slots) - 1
	i := t.home(key)
	for {
		r := t.slots[i]
		if r == 0 {
			return false
		}
		if t.keyOf(r) == key {
			break
		}
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; t.slots[j] != 0; j = (j + 1) & mask {
		h := t.home(t.keyOf(t.slots[j]))
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = 0
	t.n--
	return true
}

// resize moves every ref into an array of slots slots.
func (t *refTable) resize(slots int) {
	old := t.slots
	t.alloc(slots)
	mask := slots - 1
	for _, r := range old {
		if r == 0 {
			continue
		}
		i := t.home(t.keyOf(r))
		for t.slots[i] != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = r
	}
}

// rebuilt returns a right-sized copy of the table (the table itself never
// shrinks).
func (t *refTable) rebuilt() *refTable {
	fresh := newRefTable(t.n, t.tree, t.engines)
	mask := len(fresh.slots) - 1
	for _, r := range t.slots {
		if r == 0 {
			continue
		}
		i := fresh.home(t.keyOf(r))
		for fresh.slots[i] != 0 {
			i = (i + 1) & mask
		}
		fresh.slots[i] = r
	}
	fresh.n = t.n
	return fresh
}
