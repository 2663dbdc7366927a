package indexer

import "sync/atomic"

// Records: one per block, carrying the block's first holder and that
// holder's engine entry inline, so a block held by one rank (nearly every
// block of a fleet) is one 40-byte record plus a 4-byte slot in the node
// table, one in its rank's engine table and, bounded, one queue item.
//
// A ref names a holder or an engine entry: a record index (the record's
// inline holder or entry) or extBit | an index into the tree's exts (a
// further holder of a shared block, or an entry that found its block's
// holder already carrying one). Refs are refBits wide, so a partition
// holds at most maxIndex records and as many exts: 134M blocks, 8 GB of
// them, far past any memory budget; a store that would pass that is
// refused (ErrPartitionFull).
const (
	extBit   = 1 << (refBits - 1)
	maxIndex = extBit - 1
)

// record is one block and its inline holder and entry.
type record struct {
	key uint64 // the block's chain key
	// local is the block's local hash (a dump's tokens_hash), except in a
	// shared block (fSet): there it is the fingerprint of the block's
	// holders (high 32 bits) and the index of its holderSet (low 32), which
	// keeps the local hash. A lookup walking a shared prefix then compares
	// fingerprints without reading the sets.
	local  uint64
	engine uint64 // the inline holder's engine hash (its entry's, when it has one)
	// parent is the parent block's record index (unused for a root); it
	// is trusted only while that record's key chains to this one's (see
	// parentOf), since a record's index is reused once it is freed.
	parent uint32
	rank   uint32 // the inline holder's rank id (tree.rankIDs)
	stamp  uint32 // the inline entry's eviction stamp
	// meta holds the flags, tier and counts below. Lookups set fUsed
	// under the read lock, so readers access it atomically.
	meta uint32
}

// ext is a further holder of a shared block and/or an engine entry that
// is not inline in its block's record.
type ext struct {
	engine uint64 // the holder's or entry's engine hash
	block  uint32 // the block's record index
	rank   uint32
	stamp  uint32
	meta   uint32 // as record.meta; fRoot, fUsed and fSet are not used
}

// The bits of a meta word. The counts saturate: an engine storing one hash
// more than 63 times, or 63 of its entries covering one block, is not
// honest, and a saturated count only lets a holder go early.
const (
	tierMask   = 3      // the holder's and entry's tier
	fHolder    = 1 << 2 // a holder: the block is held by (rank, tier)
	fEntry     = 1 << 3 // an engine entry: (rank, engine) maps here
	fRoot      = 1 << 4 // the block has no parent
	fUsed      = 1 << 5 // looked up since queued (second chance, evict.go)
	fQueued    = 1 << 6 // the eviction queue holds this ref
	fSet       = 1 << 7 // the block has further holders (tree.sets, at index local)
	hrefsShift = 8      // holder: engine entries of (rank, tier) covering the block
	erefsShift = 14     // entry: times the engine stored the hash
	spanShift  = 20     // entry: our blocks it covers, this one and span-1 before it
	countMask  = 63
	maxSpan    = 1<<12 - 1
)

func hrefs(m uint32) uint32  { return m >> hrefsShift & countMask }
func erefs(m uint32) uint32  { return m >> erefsShift & countMask }
func spanOf(m uint32) int    { return int(m >> spanShift) }
func metaTier(m uint32) Tier { return Tier(m & tierMask) }

// withHrefs and withErefs return m with the count set to n (saturated).
func withHrefs(m, n uint32) uint32 {
	return m&^(countMask<<hrefsShift) | min(n, countMask)<<hrefsShift
}
func withErefs(m, n uint32) uint32 {
	return m&^(countMask<<erefsShift) | min(n, countMask)<<erefsShift
}

// holderSet is a shared block's further holders (exts) and the block's
// local hash (whose place in the record holds the set's index).
type holderSet struct {
	local uint64
	more  []uint32 // ext indexes; nil for a freed set
}

// flipHolder adds or removes holder (id, tier) in shared block r's
// fingerprint (an XOR).
func flipHolder(r *record, id uint32, tier Tier) { r.local ^= uint64(mixHolder(id, tier)) << 32 }

// setOf returns shared block rec's holder set (its meta has fSet).
func (t *tree) setOf(rec uint32) *holderSet { return t.sets.at(uint32(t.recs.at(rec).local)) }

// localOf returns block rec's local hash (meta is its meta word).
func (t *tree) localOf(rec uint32, meta uint32) uint64 {
	if meta&fSet != 0 {
		return t.setOf(rec).local
	}
	return t.recs.at(rec).local
}

// mixHolder spreads a (rank id, tier) pair over 32 bits (splitmix64); a
// block's fingerprint is the XOR of its holders' mixes, so a lookup can
// tell in O(1) that a block has the same holders as its parent.
func mixHolder(id uint32, tier Tier) uint32 {
	z := uint64(id)<<8 | uint64(tier) + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return uint32(z ^ z>>31)
}

// metaOf returns the meta word of ref.
func (t *tree) metaOf(ref uint32) *uint32 {
	if ref&extBit != 0 {
		return &t.exts.at(ref &^ extBit).meta
	}
	return &t.recs.at(ref).meta
}

// entryOf returns an entry's (or holder's) fields.
func (t *tree) entryOf(ref uint32) (engine uint64, block, rank uint32) {
	if ref&extBit != 0 {
		e := t.exts.at(ref &^ extBit)
		return e.engine, e.block, e.rank
	}
	r := t.recs.at(ref)
	return r.engine, ref, r.rank
}

// stampOf returns the eviction stamp of entry ref.
func (t *tree) stampOf(ref uint32) *uint32 {
	if ref&extBit != 0 {
		return &t.exts.at(ref &^ extBit).stamp
	}
	return &t.recs.at(ref).stamp
}

// alive reports whether a record is a block in the tree (a freed record,
// or one waiting for its queue item to be popped, holds nothing).
func alive(m uint32) bool { return m&(fHolder|fSet) != 0 }

// fingerprint returns the XOR of a block's holders' mixes (readers: under
// the read lock). Two holder sets share one with a chance of 2^-32.
func (t *tree) fingerprint(rec uint32, m uint32) uint32 {
	r := t.recs.at(rec)
	if m&fSet != 0 {
		return uint32(r.local >> 32)
	}
	if m&fHolder != 0 {
		return mixHolder(r.rank, metaTier(m))
	}
	return 0
}

// eachHolder calls fn on every holder of block rec whose meta is m.
func (t *tree) eachHolder(rec uint32, m uint32, fn func(id uint32, tier Tier, engine uint64)) {
	if m&fHolder != 0 {
		r := t.recs.at(rec)
		fn(r.rank, metaTier(m), r.engine)
	}
	if m&fSet != 0 {
		s := t.setOf(rec)
		for _, e := range s.more {
			x := t.exts.at(e)
			fn(x.rank, metaTier(x.meta), x.engine)
		}
	}
}

// findHolder returns the ref of (id, tier)'s holder of block rec.
func (t *tree) findHolder(rec, id uint32, tier Tier) (uint32, bool) {
	r := t.recs.at(rec)
	m := r.meta
	if m&fHolder != 0 && r.rank == id && metaTier(m) == tier {
		return rec, true
	}
	if m&fSet != 0 {
		s := t.setOf(rec)
		for _, e := range s.more {
			if x := t.exts.at(e); x.rank == id && metaTier(x.meta) == tier {
				return e | extBit, true
			}
		}
	}
	return 0, false
}

// addHolder makes (id, tier) a holder of block rec, with one reference;
// engine is the engine hash it is stored under (for dumps). The inline
// holder is taken when free, unless the record still has a queue item for
// an entry it held (that item must not stand for a new entry).
func (t *tree) addHolder(rec, id uint32, tier Tier, engine uint64) uint32 {
	r := t.recs.at(rec)
	m := r.meta
	if m&(fHolder|fEntry|fQueued) == 0 {
		r.rank, r.engine = id, engine
		r.meta = withHrefs(m&(fRoot|fUsed|fSet)|uint32(tier)|fHolder, 1)
		if m&fSet != 0 {
			flipHolder(r, id, tier)
		}
		return rec
	}
	e := t.exts.alloc()
	*t.exts.at(e) = ext{engine: engine, block: rec, rank: id, meta: withHrefs(uint32(tier)|fHolder, 1)}
	r = t.recs.at(rec)
	if r.meta&fSet == 0 {
		i := t.sets.alloc()
		*t.sets.at(i) = holderSet{local: r.local}
		r.local = uint64(i)
		if r.meta&fHolder != 0 {
			flipHolder(r, r.rank, metaTier(r.meta))
		}
		r.meta |= fSet
	}
	s := t.setOf(rec)
	s.more = append(s.more, e)
	flipHolder(r, id, tier)
	return e | extBit
}

// dropHolder removes holder h (its references gone) from its block,
// freeing the block once nobody holds it.
func (t *tree) dropHolder(h uint32) {
	var rec, id uint32
	var tier Tier
	if h&extBit != 0 {
		e := h &^ extBit
		x := t.exts.at(e)
		rec, id, tier = x.block, x.rank, metaTier(x.meta)
		x.meta &^= fHolder
		s := t.setOf(rec)
		for i, o := range s.more {
			if o == e {
				s.more[i] = s.more[len(s.more)-1]
				s.more = s.more[:len(s.more)-1]
				break
			}
		}
		flipHolder(t.recs.at(rec), id, tier)
		t.reclaim(h)
	} else {
		rec = h
		r := t.recs.at(rec)
		id, tier = r.rank, metaTier(r.meta)
		r.meta &^= fHolder
		if r.meta&fSet != 0 {
			flipHolder(r, id, tier)
		}
	}
	r := t.recs.at(rec)
	if r.meta&fSet != 0 {
		if s := t.setOf(rec); len(s.more) == 0 {
			i := uint32(r.local)
			r.local = s.local // the fingerprint goes with it
			*s = holderSet{}
			t.sets.release(i)
			r.meta &^= fSet
		}
	}
	if !alive(r.meta) {
		t.nodes.delRef(r.key, rec)
		t.reclaim(rec)
	}
}

// reclaim frees ref's slot when it neither holds nor maps anything and no
// queue item names it (one that does is freed when the item is popped).
func (t *tree) reclaim(ref uint32) {
	p := t.metaOf(ref)
	if *p&(fHolder|fEntry|fSet|fQueued) != 0 {
		return
	}
	*p = 0
	if ref&extBit != 0 {
		t.exts.release(ref &^ extBit)
	} else {
		t.forgetSalt(t.recs.at(ref).key)
		t.recs.release(ref)
	}
}

// loadMeta reads a record's meta under the read lock.
func (t *tree) loadMeta(rec uint32) uint32 { return atomic.LoadUint32(&t.recs.at(rec).meta) }

// markUsed records a lookup of block rec; it writes only when the mark is
// not there yet, so concurrent lookups of a hot prefix do not contend.
func (t *tree) markUsed(rec uint32) {
	p := &t.recs.at(rec).meta
	if atomic.LoadUint32(p)&fUsed == 0 {
		atomic.OrUint32(p, fUsed)
	}
}

// parentOf returns the record of block rec's parent, or 0 when rec is a
// root or its parent is no longer indexed.
func (t *tree) parentOf(rec uint32) uint32 {
	r := t.recs.at(rec)
	if atomic.LoadUint32(&r.meta)&fRoot != 0 || r.parent == 0 || r.parent >= t.recs.next {
		return 0
	}
	p := t.recs.at(r.parent)
	if !alive(atomic.LoadUint32(&p.meta)) || nextKey(p.key, t.localOf(rec, atomic.LoadUint32(&r.meta))) != r.key {
		return 0
	}
	return r.parent
}
