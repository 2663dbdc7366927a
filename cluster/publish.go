package cluster

import (
	"sync/atomic"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// The sink side: the router's own booking lifecycle, queued on the request
// path (never blocking it) and published in order by one goroutine.

// Reserved implements selection.ReplicaSink.
func (r *Replica) Reserved(rec *selection.BookingRecord) {
	r.enqueue(reserveEvent(rec, r.cfg.MaxHashes))
}

// PrefillCompleted implements selection.ReplicaSink.
func (r *Replica) PrefillCompleted(id string) { r.enqueue(event{Kind: kindPrefill, ID: id}) }

// OutputBlock implements selection.ReplicaSink.
func (r *Replica) OutputBlock(id string, decay *float64) {
	r.enqueue(event{Kind: kindOutput, ID: id, Decay: decay})
}

// Freed implements selection.ReplicaSink.
func (r *Replica) Freed(id string) { r.enqueue(event{Kind: kindFree, ID: id}) }

// ApproxRecorded implements selection.ApproxSink: the blocks are copied
// (a longer prompt's cut to MaxHashes, a prefix is still a chain).
func (r *Replica) ApproxRecorded(p selection.PartitionKey, rk selection.Rank, blocks []uint64) {
	blocks = blocks[:min(len(blocks), r.cfg.MaxHashes)]
	r.enqueue(event{Kind: kindApprox, Model: p.Model, Group: p.Group, Worker: rk.WorkerID, DPRank: rk.DPRank,
		Hashes: append([]uint64(nil), blocks...)})
}

// WorkerHealth implements selection.HealthSink.
func (r *Replica) WorkerHealth(id uint64, down bool) {
	r.ctr.healthShared.Add(1)
	r.enqueue(event{Kind: kindHealth, Worker: id, Down: down})
}

func reserveEvent(rec *selection.BookingRecord, maxHashes int) event {
	h := rec.Hashes
	if len(h) > maxHashes {
		h = h[:maxHashes] // a prefix is still a chain: the others count its blocks
	}
	return event{Kind: kindReserve, ID: rec.ID, Model: rec.Partition.Model, Group: rec.Partition.Group,
		Worker: rec.Rank.WorkerID, DPRank: rec.Rank.DPRank, Hashes: h, Prefill: rec.PrefillTokens,
		Outputs: rec.Outputs, Session: rec.Session}
}

// enqueue queues ev for publishing. While NATS is away nothing is queued
// (the announcement on return covers it); a full queue drops the event
// and asks for an announcement, which brings the others back to the truth.
func (r *Replica) enqueue(ev event) {
	if !r.connected.Load() {
		r.ctr.drop("disconnected")
		return
	}
	select {
	case r.queue <- ev:
	default:
		r.ctr.drop("queue_full")
		r.announceWanted.Store(true)
		r.poke()
	}
}

// publish is the publisher goroutine: it sends queued events in batches of
// what is waiting (one message per event when traffic is light, fewer when
// it is heavy), and announcements, hellos and heartbeats when asked.
func (r *Replica) publish() {
	batch := make([]event, 0, maxBatchEvents)
	for {
		select {
		case <-r.stop:
			return
		case ev := <-r.queue:
			batch = append(batch[:0], ev)
			size := ev.size()
		drain:
			for len(batch) < maxBatchEvents && size < r.cfg.MaxMessageBytes/2 {
				select {
				case ev := <-r.queue:
					batch = append(batch, ev)
					size += ev.size()
				default:
					break drain
				}
			}
			r.send(batch)
		case <-r.wake:
		}
		if r.due(&r.announceWanted, &r.announcedAt) {
			r.announce()
		}
		if r.due(&r.helloWanted, &r.helloAt) {
			r.send([]event{{Kind: kindHello}})
		}
		if r.heartbeatWanted.Swap(false) {
			r.heartbeat()
		}
	}
}

// due reports whether a send asked for in wanted may go now, taking the
// request and noting the time in at when it may. An announcement or a
// hello goes at most once a heartbeat: a flood of hellos (or of new
// names) made one replica announce 73 times a second, 17,000 times the
// bytes that asked. One asked for sooner waits for the next heartbeat's
// wake-up.
func (r *Replica) due(wanted *atomic.Bool, at *time.Time) bool {
	if !wanted.Load() || time.Since(*at) < r.cfg.Heartbeat {
		return false
	}
	wanted.Store(false)
	*at = time.Now()
	return true
}

// announce starts a new epoch, in which this replica's live bookings are
// all it holds: the others drop what they held of it and apply these.
// The workers it took out itself and holds out still go with them: an
// observation told while another replica could not hear it (NATS away,
// the queue full, that replica not yet joined) is not lost to it.
func (r *Replica) announce() {
	if !r.connected.Load() {
		return
	}
	r.epoch++
	r.ctr.announcements.Add(1)
	recs := r.router.LocalBookings()
	down := r.router.Health().TakenOutHere()
	events := make([]event, 0, len(recs)+len(down))
	for _, rec := range recs {
		events = append(events, reserveEvent(rec, r.cfg.MaxHashes))
	}
	for _, id := range down {
		events = append(events, event{Kind: kindHealth, Worker: id, Down: true})
	}
	batch := []event{{Kind: kindHeartbeat}} // opens the epoch even with no bookings
	size := 0
	for _, ev := range events {
		if len(batch) >= maxBatchEvents || size+ev.size() > r.cfg.MaxMessageBytes/2 {
			r.send(batch)
			batch, size = batch[:0], 0
		}
		batch = append(batch, ev)
		size += ev.size()
	}
	if len(batch) > 0 {
		r.send(batch)
	}
}

// send publishes events as one message, or as several when it would be
// over MaxMessageBytes; one event too large alone is dropped.
func (r *Replica) send(events []event) {
	if !r.connected.Load() {
		r.ctr.drop("disconnected")
		return
	}
	env := envelope{Origin: r.cfg.Name, Fingerprint: r.cfg.Fingerprint, Version: r.cfg.Version, Epoch: r.epoch,
		LeaseMs: uint64(r.cfg.Lease / time.Millisecond), Events: events}
	data, err := encode(&env)
	if err != nil {
		r.ctr.drop("malformed")
		return
	}
	if len(data) > r.cfg.MaxMessageBytes {
		if len(events) == 1 {
			r.ctr.drop("oversize")
			return
		}
		half := len(events) / 2
		r.send(events[:half])
		r.send(events[half:])
		return
	}
	if err := r.nc.Publish(r.subject, data); err != nil {
		r.ctr.drop("publish_error")
		return
	}
	r.ctr.sentMessages.Add(1)
	r.ctr.sentBytes.Add(uint64(len(data)))
	r.ctr.sentEvents.Add(uint64(len(events)))
}

// heartbeat says this replica is alive; every digestEvery-th one carries
// its index digests for the others to compare with theirs.
func (r *Replica) heartbeat() {
	ev := event{Kind: kindHeartbeat}
	if r.beats++; r.beats%digestEvery == 0 {
		for _, d := range r.router.Queries().IndexDigests() {
			if !d.Truncated && len(ev.Digests) < maxDigests {
				ev.Digests = append(ev.Digests, digest{Partition: d.Partition, Entries: d.Entries, Xor: d.Xor})
			}
		}
	}
	r.send([]event{ev})
}
