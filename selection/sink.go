package selection

import "sync/atomic"

// sinkSlot holds the one sink a part of the router tells about what it
// does (bookings, catalog writes, health decisions, approximate records:
// the replica hooks), swapped atomically while requests read it. The zero
// value holds none.
type sinkSlot[S comparable] struct{ p atomic.Pointer[sinkBox[S]] }

// sinkBox boxes a sink so that the slot can hold an interface value in
// one atomic pointer.
type sinkBox[S comparable] struct{ sink S }

// set makes s the sink; the zero S (a nil interface) empties the slot.
func (o *sinkSlot[S]) set(s S) {
	var none S
	if s == none {
		o.p.Store(nil)
		return
	}
	o.p.Store(&sinkBox[S]{sink: s})
}

// clear empties the slot if it still holds s: a sink set since stays.
func (o *sinkSlot[S]) clear(s S) {
	if h := o.p.Load(); h != nil && h.sink == s {
		o.p.CompareAndSwap(h, nil)
	}
}

// get returns the sink, or the zero S when there is none.
func (o *sinkSlot[S]) get() S {
	if h := o.p.Load(); h != nil {
		return h.sink
	}
	var none S
	return none
}
