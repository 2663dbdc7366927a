package indexer

// slab stores a tree's records (or further holders) in fixed-size pages
// addressed by 32-bit indexes: index = page<<pageBits | slot. Tables and
// queues then hold 4-byte indexes instead of 8-byte pointers or whole
// values, and growing never copies the whole store (a slice that doubles
// would hold the old and the new array at once, at 64M entries gigabytes
// of both). Only the first page grows by doubling, so a small tree stays
// small. Index 0 is never handed out: 0 means "none" in the tables.
//
// Pointers from at are valid until the next alloc (the first page may
// move while it grows); callers keep indexes, not pointers, across one.
type slab[T any] struct {
	pages [][]T
	// free holds freed indexes, reused first, in pages of freePage, all
	// full but the last. One slice that doubled copied the whole list in
	// one go: a cleared rank of 1M blocks frees 1M records, and the
	// copies and their page faults took 16 ms of one hold of the write
	// lock. spare is an emptied page kept for the next, so that allocs and
	// releases alternating at a page's edge do not allocate.
	free  [][]uint32
	spare []uint32
	next  uint32 // the lowest index never handed out
	used  int    // indexes handed out and not freed
	peak  int    // the largest used since the slab was last rebuilt
}

// freePage is how many freed indexes one page of slab.free holds (64 KB).
const freePage = 1 << 14

// pageBits sets the page size: 64k slots (2.5 MB of 40-byte records).
const (
	pageBits = 16
	pageSize = 1 << pageBits
	pageMask = pageSize - 1
)

// at returns the slot of index i.
func (s *slab[T]) at(i uint32) *T { return &s.pages[i>>pageBits][i&pageMask] }

// alloc returns an unused index; its slot holds whatever it held when it
// was freed (callers overwrite it whole).
func (s *slab[T]) alloc() uint32 {
	s.used++
	s.peak = max(s.peak, s.used)
	if k := len(s.free); k > 0 {
		page := s.free[k-1]
		n := len(page) - 1
		i := page[n]
		if n > 0 {
			s.free[k-1] = page[:n]
		} else {
			s.spare, s.free[k-1], s.free = page[:0], nil, s.free[:k-1]
		}
		return i
	}
	if s.next == 0 {
		s.next = 1 // index 0 is "none"
	}
	i := s.next
	s.next++
	p, o := int(i>>pageBits), int(i&pageMask)
	switch {
	case p == len(s.pages) && p == 0:
		s.pages = append(s.pages, make([]T, 1, 64)) // slot 0 stays zero
	case p == len(s.pages):
		s.pages = append(s.pages, make([]T, 0, pageSize))
	}
	page := s.pages[p]
	if o == len(page) {
		var zero T
		page = append(page, zero) // grows (by doubling) on the first page only
		s.pages[p] = page
	}
	return i
}

// room is how many more indexes alloc can hand out (at most maxIndex in all).
func (s *slab[T]) room() int { return s.freed() + maxIndex + 1 - int(max(s.next, 1)) }

// freed is how many freed indexes wait for reuse.
func (s *slab[T]) freed() int {
	k := len(s.free)
	if k == 0 {
		return 0
	}
	return (k-1)*freePage + len(s.free[k-1])
}

// release returns index i for reuse.
func (s *slab[T]) release(i uint32) {
	s.used--
	k := len(s.free)
	if k == 0 || len(s.free[k-1]) == freePage {
		page := s.spare
		if page == nil {
			page = make([]uint32, 0, freePage)
		}
		s.spare = nil
		s.free = append(s.free, page)
		k++
	}
	s.free[k-1] = append(s.free[k-1], i)
}

// each calls fn on every index ever handed out and its slot, freed ones
// included (callers tell them apart by content).
func (s *slab[T]) each(fn func(i uint32, v *T)) {
	for p, page := range s.pages {
		for o := range page {
			if i := uint32(p<<pageBits | o); i != 0 {
				fn(i, &page[o])
			}
		}
	}
}
