package selection

// Approximate-index records shared between replicas (docs/replicas.md):
// in approximate mode (use_kv_events off) a booked prompt is recorded as
// cached on its rank. The recorder the router feeds is wrapped so that
// each record is also told to an ApproxSink, which tells the others; they
// apply it with RecordPeerBooking, straight into their index, which tells
// no sink, so a record crosses once.

// ApproxSink hears the blocks this router records as cached on a rank. It
// is called on the request path, outside every router lock: it must not
// block, must not call back into the router, and must copy blocks (the
// slice is the request's work buffer).
type ApproxSink interface {
	ApproxRecorded(p PartitionKey, r Rank, blocks []uint64)
}

// sharingRecorder feeds the index and tells the sink, if any.
type sharingRecorder struct {
	inner BookingRecorder
	out   sinkSlot[ApproxSink]
}

// RecordBooking implements BookingRecorder.
func (s *sharingRecorder) RecordBooking(p PartitionKey, r Rank, blocks []uint64) {
	s.inner.RecordBooking(p, r, blocks)
	s.tell(p, r, blocks)
}

// RecordBookingChain implements ChainRecorder: the index is keyed by the
// chain of the blocks, which a peer computes again from the blocks alone.
func (s *sharingRecorder) RecordBookingChain(p PartitionKey, r Rank, blocks, chain []uint64) {
	if cr, ok := s.inner.(ChainRecorder); ok {
		cr.RecordBookingChain(p, r, blocks, chain)
	} else {
		s.inner.RecordBooking(p, r, blocks)
	}
	s.tell(p, r, blocks)
}

func (s *sharingRecorder) tell(p PartitionKey, r Rank, blocks []uint64) {
	if sink := s.out.get(); sink != nil && len(blocks) > 0 {
		sink.ApproxRecorded(p, r, blocks)
	}
}

// SetApproxSink makes the router tell s about every booking its
// approximate index records from now on; nil stops it. Without an index
// that learns from bookings (event mode) it does nothing.
func (r *Router) SetApproxSink(s ApproxSink) {
	if r.approxShare == nil {
		return
	}
	r.approxShare.out.set(s)
}

// ClearApproxSink stops telling s (and only s: a sink set since stays).
func (r *Router) ClearApproxSink(s ApproxSink) {
	if r.approxShare == nil {
		return
	}
	r.approxShare.out.clear(s)
}

// RecordPeerBooking records blocks as cached on rank rk of partition p, as
// another replica's approximate index did; it reports false (nothing
// recorded) in event mode or when this router has no such schedulable
// rank. The caller bounds len(blocks).
func (r *Router) RecordPeerBooking(p PartitionKey, rk Rank, blocks []uint64) bool {
	if r.approxShare == nil || len(blocks) == 0 {
		return false
	}
	part := r.catalog.partition(p)
	if part == nil {
		return false
	}
	part.mu.Lock()
	_, ok := part.byRank[rk]
	part.mu.Unlock()
	if !ok {
		return false
	}
	r.approxShare.inner.RecordBooking(p, rk, blocks)
	return true
}
