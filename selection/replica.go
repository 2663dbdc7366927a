package selection

import "slices"

// Replicas (docs/replicas.md): several gateways in front of one fleet share
// their bookings, so that each one's load per rank is the fleet's. This
// file is the router's side of it, free of any transport: a sink that hears
// the router's own booking lifecycle (to publish it), and the remote table
// (replica_remote.go) that applies other replicas' bookings as load.

// BookingRecord is one booking as another replica needs it: where it
// lands and what load it adds there.
type BookingRecord struct {
	ID        string
	Partition PartitionKey
	Rank      Rank
	// Hashes are the booking's tracking hashes (its active prompt blocks).
	// The slice is shared with the router and must not be modified.
	Hashes []uint64
	// PrefillTokens are the prefill tokens outstanding (0 when prefill
	// is not tracked or is complete).
	PrefillTokens uint64
	// Outputs are the output blocks added so far.
	Outputs int
	// Session is the session whose lease the booking holds ("" for none).
	Session string
}

// ReplicaSink hears the router's own booking lifecycle. Its methods are
// called on the request path, outside every router lock: they must not
// block (queue and return) and must not call back into the router.
type ReplicaSink interface {
	Reserved(rec *BookingRecord)
	PrefillCompleted(id string)
	OutputBlock(id string, decayFraction *float64)
	Freed(id string)
}

// replicaOut is the bookings' link to the sink; the zero value has none.
type replicaOut struct{ sinkSlot[ReplicaSink] }

// record builds what the sink hears of b; b must not be shared yet, or
// its partition's lock must be held (prefill and outputs change under it).
func (b *booking) record() *BookingRecord {
	hashes := b.hashes
	if b.buf != nil {
		// A pooled buffer never leaves the router: the sink may read the
		// record after the booking is freed and the buffer reused.
		hashes = slices.Clone(hashes)
	}
	return &BookingRecord{ID: b.id, Partition: b.key, Rank: b.rs.rank, Hashes: hashes,
		PrefillTokens: b.prefill, Outputs: b.outputs, Session: b.session}
}

// reserved tells the sink about a booking about to be committed.
func (o *replicaOut) reserved(b *booking) {
	if s := o.get(); s != nil {
		s.Reserved(b.record())
	}
}

func (o *replicaOut) prefillCompleted(id string) {
	if s := o.get(); s != nil {
		s.PrefillCompleted(id)
	}
}

func (o *replicaOut) outputBlock(id string, decay *float64) {
	if s := o.get(); s != nil {
		s.OutputBlock(id, decay)
	}
}

func (o *replicaOut) freed(id string) {
	if s := o.get(); s != nil {
		s.Freed(id)
	}
}

// SetReplicaSink makes the router tell s about every booking it makes,
// completes and frees from now on; nil stops it. A replica that (re)joins
// announces the bookings already live with LocalBookings.
func (r *Router) SetReplicaSink(s ReplicaSink) {
	r.book.replica.set(s)
}

// ClearReplicaSink stops telling s (and only s: a sink set since stays).
func (r *Router) ClearReplicaSink(s ReplicaSink) {
	r.book.replica.clear(s)
}

// LocalBookings returns this router's own live bookings, as a replica
// re-announces them after it (re)connects.
func (r *Router) LocalBookings() []*BookingRecord {
	r.book.mu.Lock()
	live := make([]*booking, 0, len(r.book.reservations))
	for _, b := range r.book.reservations {
		if b != nil {
			live = append(live, b)
		}
	}
	r.book.mu.Unlock()
	out := make([]*BookingRecord, 0, len(live))
	for _, b := range live {
		p := b.part
		p.mu.Lock()
		if !b.freed {
			out = append(out, b.record())
		}
		p.mu.Unlock()
	}
	return out
}
