package indexer

import (
	"iter"
	"math/bits"
	"math/rand/v2"
)

// refTable is the index's hash table from a 64-bit hash to a record or
// entry ref: open addressing over buckets of twelve 4-byte slots that
// share one 64-byte cache line with a one-byte tag per slot. A slot's key
// is read through the tree: the record's chain key in the node table, the
// entry's engine hash in a rank's table (engines set). A key costs a slot
// and a tag where a (key, value) slot cost 16 or 24 bytes and a Go map's
// more.
//
// Go's maps cost the steady-state ingest two probes where one would do
// (a lookup, then an assignment or a delete, for each of a block's node
// and engine entries) and hash every key again; here claim finds or
// claims a key's slot in one probe. Keys are hashes, some chosen by
// publishers (engine block hashes), so a key's bucket and tag come from
// the key mixed with a per-table random seed: a publisher cannot aim keys
// at one bucket without knowing it.
//
// Why buckets with tags (the earlier table was linear probing over bare
// slots, with a slot's distance from its home in its spare bits): a probe
// reads a slot's record only when the slot's tag is the key's (one slot
// in 255 of the others), where the bare slots made it read the record of
// every slot at the key's distance, a cache miss on a fleet's index for
// nothing; and the tags sit in the line the probe reads anyway (a tag
// array of its own cost one more miss a probe, BENCHMARKS.md). A deletion
// clears its slot and is done, where linear probing shifted the rest of
// the run back, a loop of coin-toss branches that was the largest single
// cost of DecodeApply. A bucket instead counts the keys whose probe passed
// it full (passed): a find goes on past a bucket only while that count is
// nonzero, so deletions leave no tombstones. The load stays at most 7/8
// (the table doubles past it; a large one may reach 15/16 before it does,
// grow.go). At 2/3, where a steady table sits between
// doublings, about 8 % of buckets were full and 30 % had been passed, so
// most probes end in their home bucket.
type refTable struct {
	buckets []bucket
	n       int
	shift   uint8 // 64 − log2(len(buckets)): a hash's top bits pick its bucket
	seed    uint64
	// tree holds the records the refs name; engines tells the two kinds of
	// table apart (a branch, where a func value's call could not be inlined).
	tree    *tree
	engines bool
	// rank is an engine table's rank id (tree.rankIDs), kept here so an
	// event finds its rank's table and id in one map lookup.
	rank uint32
	// growing is set while the table waits to grow after the write lock
	// is released (grow.go).
	growing bool
}

// bucket is one cache line: twelve slots' tags, how many keys passed it
// full, and the slots' refs. A tag is 0 for an empty slot, else the low
// byte of the key's hash (never 0, see tagOf).
type bucket struct {
	lo     uint64 // the tags of slots 0-7, a byte each, slot 0 lowest
	hi     uint32 // the tags of slots 8-11
	passed uint32 // keys held in a later bucket whose probe began at or before this one
	refs   [bucketSlots]uint32
}

const (
	bucketSlots = 12
	// A slot index (find, claim, delAt) is its bucket's index shifted by
	// slotBits, or'ed with the slot's place in the bucket.
	slotBits = 4
	slotMask = 1<<slotBits - 1
	// The tables grow past loadNum/loadDen keys per slot.
	loadNum, loadDen = 7, 8
)

// Refs are at most refBits wide, which bounds a partition (maxIndex).
const refBits = 28

// tableMinBuckets is the smallest array a table allocates: two, so that
// a hash's shift (64 − log2 of the buckets) stays under 64 and compiles
// to one instruction (see homeOf).
const tableMinBuckets = 2

// bucketsFor is the power of two that holds n keys at a load of 7/8 at
// most.
func bucketsFor(n int) int {
	b := tableMinBuckets
	for capacityOf(b) < n {
		b *= 2
	}
	return b
}

// capacityOf is how many keys b buckets hold before the table grows.
func capacityOf(b int) int { return b * bucketSlots * loadNum / loadDen }

// newRefTable returns a table sized for n keys without growing.
func newRefTable(n int, tr *tree, engines bool) *refTable {
	t := &refTable{seed: rand.Uint64() | 1, tree: tr, engines: engines}
	t.alloc(bucketsFor(n))
	return t
}

func (t *refTable) alloc(buckets int) {
	t.buckets = make([]bucket, buckets)
	t.shift = uint8(64 - bits.TrailingZeros(uint(buckets)))
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

// hashOf is key mixed with the seed (the finalizer of splitmix64): its
// top bits pick the key's home bucket, its low byte the key's tag. It does
// not depend on the table's size, so one computed before a growth stays
// good.
func (t *refTable) hashOf(key uint64) uint64 {
	z := key ^ t.seed
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// homeOf is the bucket where the probe for hash h begins.
func (t *refTable) homeOf(h uint64) int { return int(h >> (t.shift & 63)) }

// tagOf is hash h's tag: its low byte, 0 (the empty slots' tag) made 1.
func tagOf(h uint64) uint64 {
	tag := h & 0xff
	if tag == 0 {
		tag = 1
	}
	return tag
}

// lo7 and hi1 pick the low seven bits and the top bit of each byte.
const (
	lo7 = 0x7f7f7f7f7f7f7f7f
	hi1 = 0x8080808080808080
)

// zeroBytes has the top bit set in each byte of x that is 0, and no other
// bit (exact: no carry crosses a byte).
func zeroBytes(x uint64) uint64 { return ^((x&lo7 + lo7) | x | lo7) }

// matches returns b's slots whose tag is the one bc repeats in every
// byte (broadcast), as the top bits of bytes: slots 0-7 in lo, 8-11 in
// hi.
func (b *bucket) matches(bc uint64) (lo, hi uint64) {
	return zeroBytes(b.lo ^ bc), zeroBytes(uint64(b.hi)^bc) & (hi1 >> 32)
}

// empties returns b's empty slots as matches does.
func (b *bucket) empties() (lo, hi uint64) {
	return zeroBytes(b.lo), zeroBytes(uint64(b.hi)) & (hi1 >> 32)
}

// setTag sets slot j's tag.
func (b *bucket) setTag(j int, tag uint64) {
	if j < 8 {
		s := uint(j) * 8
		b.lo = b.lo&^(0xff<<s) | tag<<s
		return
	}
	s := uint(j-8) * 8
	b.hi = b.hi&^(0xff<<s) | uint32(tag)<<s
}

// broadcast repeats a tag in every byte.
func broadcast(tag uint64) uint64 { return tag * 0x0101010101010101 }

// Len returns how many keys the table holds.
func (t *refTable) Len() int {
	if t == nil {
		return 0
	}
	return t.n
}

// refAt returns the ref in slot i.
func (t *refTable) refAt(i int) uint32 { return t.buckets[i>>slotBits].refs[i&slotMask] }

// find returns key's slot index and whether it is held.
func (t *refTable) find(key uint64) (int, bool) { return t.findFrom(t.hashOf(key), key) }

// findFrom is find with key's hash h already known; it returns -1 when the
// key is not held. Its probe, like claimAt's and delRefFrom's, ends at the
// first bucket no key passed, or once it has walked every bucket: a small
// table near its load bound can have every bucket passed by some key (a
// key homed at each overflowed into the next while that one had room, and
// the room was taken later), and a probe for an absent key then went round
// for ever, holding the partition's lock.
func (t *refTable) findFrom(h uint64, key uint64) (int, bool) {
	mask := len(t.buckets) - 1
	bc := broadcast(tagOf(h))
	home := t.homeOf(h)
	for b := home; ; b = (b + 1) & mask {
		bk := &t.buckets[b]
		lo, hi := bk.matches(bc)
		for ; lo != 0; lo &= lo - 1 {
			j := bits.TrailingZeros64(lo) >> 3
			if t.keyOf(bk.refs[j]) == key {
				return b<<slotBits | j, true
			}
		}
		for ; hi != 0; hi &= hi - 1 {
			j := 8 + bits.TrailingZeros64(hi)>>3
			if t.keyOf(bk.refs[j]) == key {
				return b<<slotBits | j, true
			}
		}
		if bk.passed == 0 || (b+1)&mask == home {
			return -1, false // or every bucket walked: see findFrom
		}
	}
}

// get returns key's ref, or 0 when it is not held.
func (t *refTable) get(key uint64) uint32 {
	_, r := t.lookup(key)
	return r
}

// getAt is get with key's hash h already known.
func (t *refTable) getAt(h uint64, key uint64) uint32 {
	if t.n == 0 {
		return 0
	}
	if i, ok := t.findFrom(h, key); ok {
		return t.refAt(i)
	}
	return 0
}

// lookup returns key's slot index and ref, or (-1, 0) when it is not
// held; the index is for delAt.
func (t *refTable) lookup(key uint64) (int, uint32) {
	if t == nil || t.n == 0 {
		return -1, 0
	}
	if i, ok := t.find(key); ok {
		return i, t.refAt(i)
	}
	return -1, 0
}

// claimed is a slot claim hands out: held, or to be filled.
type claimed struct {
	t    *refTable
	i    int
	h    uint64 // the key's hash
	held bool
}

// ref returns the held slot's ref.
func (c claimed) ref() uint32 { return c.t.refAt(c.i) }

// fill stores ref, whose key must be the claimed key, in a claimed empty
// slot.
func (c claimed) fill(ref uint32) {
	bk := &c.t.buckets[c.i>>slotBits]
	j := c.i & slotMask
	bk.refs[j] = ref
	bk.setTag(j, tagOf(c.h))
}

// claim finds key's slot, or claims an empty one for it. The caller must
// fill a claimed slot before the table is used again.
func (t *refTable) claim(key uint64) claimed { return t.claimAt(t.hashOf(key), key) }

// reserve grows the table, if need be, so that n more keys fit without
// growing.
func (t *refTable) reserve(n int) {
	if t.n+n > capacityOf(len(t.buckets)) && !t.growLater(n) {
		t.resize(max(2*len(t.buckets), bucketsFor(t.n+n)))
	}
}

// claimAt is claim with key's hash h already known. One walk finds the
// key or proves it absent and, on the way, the first empty slot a new key
// takes: nearly always in the key's home bucket, where the walk most
// often ends too (about 30 % of buckets at 2/3 load have had a key pass
// them full, and the walk goes on past those).
func (t *refTable) claimAt(h uint64, key uint64) claimed {
	mask := len(t.buckets) - 1
	bc := broadcast(tagOf(h))
	home := t.homeOf(h)
	empty := -1
	for b := home; ; b = (b + 1) & mask {
		bk := &t.buckets[b]
		lo, hi := bk.matches(bc)
		for ; lo != 0; lo &= lo - 1 {
			if j := bits.TrailingZeros64(lo) >> 3; t.keyOf(bk.refs[j]) == key {
				return claimed{t: t, i: b<<slotBits | j, h: h, held: true}
			}
		}
		for ; hi != 0; hi &= hi - 1 {
			if j := 8 + bits.TrailingZeros64(hi)>>3; t.keyOf(bk.refs[j]) == key {
				return claimed{t: t, i: b<<slotBits | j, h: h, held: true}
			}
		}
		if empty < 0 {
			if lo, hi := bk.empties(); lo != 0 {
				empty = b<<slotBits | bits.TrailingZeros64(lo)>>3
			} else if hi != 0 {
				empty = b<<slotBits | 8 + bits.TrailingZeros64(hi)>>3
			}
		}
		if bk.passed == 0 || (b+1)&mask == home {
			break // or every bucket walked: see findFrom
		}
	}
	t.n++
	if t.n > capacityOf(len(t.buckets)) && !t.growLater(0) {
		t.resize(2 * len(t.buckets))
		empty = -1
	}
	if empty < 0 {
		return claimed{t: t, i: t.place(h), h: h} // every bucket walked is full
	}
	for b := home; b != empty>>slotBits; b = (b + 1) & mask {
		t.buckets[b].passed++
	}
	return claimed{t: t, i: empty, h: h}
}

// place returns the first empty slot on hash h's probe, counting the full
// buckets it passes; the caller fills it.
func (t *refTable) place(h uint64) int {
	mask := len(t.buckets) - 1
	for b := t.homeOf(h); ; b = (b + 1) & mask {
		bk := &t.buckets[b]
		if lo, hi := bk.empties(); lo != 0 {
			return b<<slotBits | bits.TrailingZeros64(lo)>>3
		} else if hi != 0 {
			return b<<slotBits | 8 + bits.TrailingZeros64(hi)>>3
		}
		bk.passed++
	}
}

// del removes key; false when it was not held.
func (t *refTable) del(key uint64) bool {
	if t == nil || t.n == 0 {
		return false
	}
	h := t.hashOf(key)
	i, ok := t.findFrom(h, key)
	if ok {
		t.delAt(i, h)
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
	return t.delRefFrom(t.hashOf(key), ref)
}

// delRefFrom is delRef with the key's hash h already known. Its walk is
// findFrom's, comparing refs where findFrom compares keys: one walk for
// both, told which compare by an argument, cost DecodeApply 4 % (147
// against 142 cpu-ns a block, three runs of three), so it is written
// twice.
func (t *refTable) delRefFrom(h uint64, ref uint32) bool {
	mask := len(t.buckets) - 1
	bc := broadcast(tagOf(h))
	home := t.homeOf(h)
	for b := home; ; b = (b + 1) & mask {
		bk := &t.buckets[b]
		lo, hi := bk.matches(bc)
		for ; lo != 0; lo &= lo - 1 {
			if j := bits.TrailingZeros64(lo) >> 3; bk.refs[j] == ref {
				t.delAt(b<<slotBits|j, h)
				return true
			}
		}
		for ; hi != 0; hi &= hi - 1 {
			if j := 8 + bits.TrailingZeros64(hi)>>3; bk.refs[j] == ref {
				t.delAt(b<<slotBits|j, h)
				return true
			}
		}
		if bk.passed == 0 || (b+1)&mask == home {
			return false // or every bucket walked: see findFrom
		}
	}
}

// delAt empties slot i, which holds a key whose hash is h (from find or
// lookup, the table unchanged since): the buckets its probe passed count
// one key fewer.
func (t *refTable) delAt(i int, h uint64) {
	b := i >> slotBits
	bk := &t.buckets[b]
	bk.setTag(i&slotMask, 0)
	bk.refs[i&slotMask] = 0
	mask := len(t.buckets) - 1
	for p := t.homeOf(h); p != b; p = (p + 1) & mask {
		t.buckets[p].passed--
	}
	t.n--
}

// resize moves every ref into an array of buckets buckets.
func (t *refTable) resize(buckets int) { t.buckets, t.shift = t.laidOut(buckets) }

// laidOut places t's refs in a new array of buckets buckets under t's
// seed, so that hashes computed before stay good, and returns the array
// and its shift; t itself is not changed (grow.go builds the array
// beside the table's lookups).
func (t *refTable) laidOut(buckets int) ([]bucket, uint8) {
	fresh := refTable{seed: t.seed, tree: t.tree, engines: t.engines}
	fresh.alloc(buckets)
	fresh.insertAll(t.buckets)
	return fresh.buckets, fresh.shift
}

// insertAll places the refs of old buckets (the table holding none).
func (t *refTable) insertAll(old []bucket) {
	for b := range old {
		refs, n := old[b].held()
		for _, r := range refs[:n] {
			h := t.hashOf(t.keyOf(r))
			claimed{t: t, i: t.place(h), h: h}.fill(r)
		}
	}
}

// held returns the refs of b's full slots, the first n of refs. An array
// by value, not a slice: a slice of a local array would be allocated on
// the heap for every bucket a growth, rebuild or dump goes through.
func (b *bucket) held() (refs [bucketSlots]uint32, n int) {
	for j, r := range b.refs {
		if b.tag(j) != 0 {
			refs[n] = r
			n++
		}
	}
	return refs, n
}

// rebuilt returns a right-sized copy of the table (the table itself never
// shrinks).
func (t *refTable) rebuilt() *refTable {
	fresh := newRefTable(t.n, t.tree, t.engines)
	fresh.rank = t.rank
	fresh.insertAll(t.buckets)
	fresh.n = t.n
	return fresh
}

// refs yields every ref; the table must not change meanwhile.
func (t *refTable) refs() iter.Seq[uint32] {
	return func(yield func(uint32) bool) {
		for b := range t.buckets {
			refs, n := t.buckets[b].held()
			for _, r := range refs[:n] {
				if !yield(r) {
					return
				}
			}
		}
	}
}

// tag returns slot j's tag.
func (b *bucket) tag(j int) uint64 {
	if j < 8 {
		return b.lo >> (uint(j) * 8) & 0xff
	}
	return uint64(b.hi) >> (uint(j-8) * 8) & 0xff
}

// each calls fn on every ref; the table must not change meanwhile.
func (t *refTable) each(fn func(ref uint32)) {
	for r := range t.refs() {
		fn(r)
	}
}

// renumber replaces every ref r by to(r) in place (a slab rebuild: the
// keys, and so the slots, stay).
func (t *refTable) renumber(to func(ref uint32) uint32) {
	for b := range t.buckets {
		bk := &t.buckets[b]
		for j, r := range bk.refs {
			if bk.tag(j) != 0 {
				bk.refs[j] = to(r)
			}
		}
	}
}
