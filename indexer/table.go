package indexer

import (
	"iter"
	"math/bits"
	"math/rand/v2"
)

// table is the index's hash table from a 64-bit hash to a value: open
// addressing with linear probing over one array of (key, value) slots.
//
// Go's maps cost the steady-state ingest two probes where one would do
// (a lookup, then an assignment or a delete, for each of a block's node
// and engine entries: eight per stored and removed block) and hash every
// key again; here upsert finds or claims a key's slot in one probe and
// hands back a pointer to its value. Keys are hashes, some chosen by
// publishers (engine block hashes), so the slot comes from the key mixed
// with a per-table random seed: a publisher cannot aim keys at one run of
// slots without knowing it. The load stays at most 3/4 (the table doubles
// past it), so a probe run stays short on average. Key 0 has no slot of
// its own (0 marks an empty slot) and lives beside the array.
//
// A pointer from ptr or upsert is valid until the next upsert or del.
type table[V any] struct {
	slots   []tableSlot[V]
	n       int // keys held, zero included
	shift   uint8
	seed    uint64
	hasZero bool
	zero    V
}

type tableSlot[V any] struct {
	key uint64
	val V
}

// tableMinSlots is the smallest array a table allocates.
const tableMinSlots = 8

// newTable returns a table sized for n keys without growing.
func newTable[V any](n int) *table[V] {
	t := &table[V]{seed: rand.Uint64() | 1}
	t.alloc(slotsFor(n))
	return t
}

// slotsFor is the power of two that holds n keys at a load of 3/4 at most.
func slotsFor(n int) int {
	s := tableMinSlots
	for s*3/4 < n {
		s *= 2
	}
	return s
}

func (t *table[V]) alloc(slots int) {
	t.slots = make([]tableSlot[V], slots)
	t.shift = uint8(64 - bits.TrailingZeros(uint(slots)))
}

// home is key's first slot: the key mixed with the seed (the finalizer of
// splitmix64), its top bits.
func (t *table[V]) home(key uint64) int {
	z := key ^ t.seed
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return int((z ^ z>>31) >> t.shift)
}

// Len returns how many keys the table holds.
func (t *table[V]) Len() int {
	if t == nil {
		return 0
	}
	return t.n
}

// get returns key's value and whether it is held.
func (t *table[V]) get(key uint64) (V, bool) {
	if p := t.ptr(key); p != nil {
		return *p, true
	}
	var none V
	return none, false
}

// ptr returns a pointer to key's value, nil when it is not held.
func (t *table[V]) ptr(key uint64) *V {
	if t == nil || t.n == 0 {
		return nil
	}
	if key == 0 {
		if t.hasZero {
			return &t.zero
		}
		return nil
	}
	mask := len(t.slots) - 1
	for i := t.home(key); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.key == key {
			return &s.val
		}
		if s.key == 0 {
			return nil
		}
	}
}

// upsert returns a pointer to key's value, claiming a zero value for it
// when it is not held (held reports which).
func (t *table[V]) upsert(key uint64) (p *V, held bool) {
	if key == 0 {
		if !t.hasZero {
			t.hasZero = true
			t.n++
			var none V
			t.zero = none
			return &t.zero, false
		}
		return &t.zero, true
	}
	if (t.n+1)*4 > len(t.slots)*3 {
		t.resize(max(2*len(t.slots), tableMinSlots))
	}
	mask := len(t.slots) - 1
	for i := t.home(key); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.key == key {
			return &s.val, true
		}
		if s.key == 0 {
			s.key = key
			t.n++
			return &s.val, false
		}
	}
}

// set stores key's value.
func (t *table[V]) set(key uint64, v V) {
	p, _ := t.upsert(key)
	*p = v
}

// del removes key; false when it was not held. The keys after it in its
// probe run move back to fill the hole, so no tombstones accumulate under
// an engine's churn of stores and removals.
func (t *table[V]) del(key uint64) bool {
	var none V
	if key == 0 {
		if !t.hasZero {
			return false
		}
		t.hasZero, t.zero = false, none
		t.n--
		return true
	}
	if t.n == 0 {
		return false
	}
	mask := len(t.slots) - 1
	i := t.home(key)
	for ; t.slots[i].key != key; i = (i + 1) & mask {
		if t.slots[i].key == 0 {
			return false
		}
	}
	// Backward-shift deletion: a later key of the run moves into the hole
	// unless its home lies cyclically in (hole, its slot].
	for j := (i + 1) & mask; t.slots[j].key != 0; j = (j + 1) & mask {
		h := t.home(t.slots[j].key)
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = tableSlot[V]{}
	t.n--
	return true
}

// resize moves every key into an array of slots slots.
func (t *table[V]) resize(slots int) {
	old := t.slots
	t.alloc(slots)
	mask := slots - 1
	for k := range old {
		s := &old[k]
		if s.key == 0 {
			continue
		}
		i := t.home(s.key)
		for t.slots[i].key != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = *s
	}
}

// All yields every (key, value); the table must not change meanwhile.
func (t *table[V]) All() iter.Seq2[uint64, V] {
	return func(yield func(uint64, V) bool) {
		if t == nil {
			return
		}
		if t.hasZero && !yield(0, t.zero) {
			return
		}
		for i := range t.slots {
			if s := &t.slots[i]; s.key != 0 && !yield(s.key, s.val) {
				return
			}
		}
	}
}
