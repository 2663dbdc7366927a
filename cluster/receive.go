package cluster

import (
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// receive applies one message from another replica. NATS calls it on one
// goroutine per subscription, so messages apply in the order each origin
// sent them.
func (r *Replica) receive(msg *nats.Msg) {
	r.ctr.recvMessages.Add(1)
	r.ctr.recvBytes.Add(uint64(len(msg.Data)))
	if len(msg.Data) > r.cfg.MaxMessageBytes {
		r.ctr.drop("oversize")
		return
	}
	origin := msg.Subject[strings.LastIndexByte(msg.Subject, '.')+1:]
	if checkToken("origin", origin) != nil {
		// Not a name a replica can have: it would reach the metrics as
		// a label, where a name that is not UTF-8 failed every scrape.
		r.ctr.drop("malformed")
		return
	}
	var env envelope
	if err := decode(msg.Data, &env, max(maxEventsPerEnv, r.cfg.MaxHashes, maxDigests)); err != nil || env.Origin != origin || len(env.Events) > maxEventsPerEnv {
		r.ctr.drop("malformed")
		return
	}
	if reason := r.refusal(&env); reason != "" {
		r.ctr.refuse(reason)
		r.logRefusal(origin, reason, &env)
		return
	}
	if env.Epoch > uint64(time.Now().Add(maxEpochAhead).UnixNano()) {
		// Epochs start at their process's clock: one far ahead of this
		// one's is no replica's, and taken as the origin's newest it
		// would drop the origin's bookings and make its real messages
		// stale.
		r.ctr.drop("future_epoch")
		return
	}
	diff, compared := r.compareDigests(&env)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.connected.Load() {
		return // a message raced the outage: this replica routes alone now
	}
	p := r.peers[origin]
	if p == nil {
		if len(r.peers) >= maxPeers {
			r.ctr.drop("over_bound")
			return
		}
		p = &peer{epoch: env.Epoch}
		r.peers[origin] = p
		// Heard for the first time (or again after its lease ran out): what
		// it booked before is unknown here, so ask every replica to announce.
		r.helloWanted.Store(true)
		r.poke()
	} else if env.Epoch < p.epoch {
		// An older epoch: what the origin's previous process or link
		// still had on its way. Applied, it would bring back bookings the
		// newer epoch replaced, and its epoch would make the newer one's
		// next message drop the live bookings in turn.
		if !r.newerEpochSilent(p) {
			r.ctr.drop("stale_epoch")
			return
		}
		// The newer epoch has said nothing for a lease while this one
		// speaks: it was no process of the origin's (one message under
		// its name, its epoch up to an hour ahead, hid the real replica's
		// bookings for as long as its claimed lease, ten minutes), or a
		// process that is gone. This one is the origin now; its bookings
		// are asked for again.
		r.router.Remote().DropOrigin(origin)
		p.epoch = env.Epoch
		r.ctr.epochsReverted.Add(1)
		r.log.Warn("a replica's newer epoch went silent while an older one speaks: the older one is followed again",
			zap.String("replica", origin))
		r.helloWanted.Store(true)
		r.poke()
	} else if env.Epoch > p.epoch {
		// A new epoch: the origin announces its bookings afresh.
		r.router.Remote().DropOrigin(origin)
		p.epoch = env.Epoch
	}
	p.lastSeen, p.lease = time.Now(), r.leaseOf(&env)
	if r.refusedAt[origin] {
		// Its settings match again: a later mismatch (the next rollout)
		// is logged anew.
		delete(r.refusedAt, origin)
	}
	if compared {
		p.digestDiff = diff
	}
	for i := range env.Events {
		r.apply(origin, &env.Events[i])
	}
}

// newerEpochSilent reports whether p's current epoch has been silent for
// a lease: p's own, or this replica's when shorter (a message's claimed
// lease, ten minutes at most, must not say how long a forged epoch holds).
func (r *Replica) newerEpochSilent(p *peer) bool {
	return time.Since(p.lastSeen) >= min(p.lease, r.cfg.Lease)
}

// refusal names why a message is refused, or "".
func (r *Replica) refusal(env *envelope) string {
	switch {
	case env.Origin == r.cfg.Name:
		return "own_name"
	case env.Fingerprint != r.cfg.Fingerprint:
		return "fingerprint"
	case env.Version != r.cfg.Version:
		return "version"
	}
	return ""
}

// leaseOf is how long env's sender keeps its bookings here after its last
// message: the lease it says it runs, or this replica's own when it says
// none. The claim is held between twice this replica's heartbeat and
// maxPeerLease: a lease of a millisecond made its sender lapse and be
// heard anew between any two of its messages, each time asking every
// replica to announce.
func (r *Replica) leaseOf(env *envelope) time.Duration {
	if env.LeaseMs == 0 {
		return r.cfg.Lease
	}
	claimed := time.Duration(min(env.LeaseMs, uint64(maxPeerLease/time.Millisecond))) * time.Millisecond
	return max(claimed, 2*r.cfg.Heartbeat)
}

// logRefusal logs the first refusal of each origin since it was last
// accepted (bounded: a hostile stream of names cannot grow the set past
// maxPeers).
func (r *Replica) logRefusal(origin, reason string, env *envelope) {
	r.mu.Lock()
	first := !r.refusedAt[origin] && len(r.refusedAt) < maxPeers
	if first {
		r.refusedAt[origin] = true
	}
	r.mu.Unlock()
	if first {
		r.log.Warn("refusing messages from a replica with other settings or another version",
			zap.String("replica", origin), zap.String("reason", reason),
			zap.Uint64("their_fingerprint", env.Fingerprint), zap.Uint64("our_fingerprint", r.cfg.Fingerprint),
			zap.String("their_version", env.Version), zap.String("our_version", r.cfg.Version))
	}
}

// apply applies one event of origin; r.mu is held.
func (r *Replica) apply(origin string, ev *event) {
	remote := r.router.Remote()
	if ev.Kind != kindHeartbeat && ev.Kind != kindHello && ev.Kind != kindHealth && ev.Kind != kindApprox && (ev.ID == "" || len(ev.ID) > maxIDBytes) {
		r.ctr.drop("bad_field")
		return
	}
	switch ev.Kind {
	case kindHeartbeat:
	case kindHello:
		r.announceWanted.Store(true)
		r.poke()
	case kindReserve:
		if len(ev.Hashes) > r.cfg.MaxHashes || len(ev.Session) > maxSessionBytes ||
			len(ev.Model) > maxPartitionBytes || len(ev.Group) > maxPartitionBytes ||
			ev.Outputs < 0 || ev.Outputs > maxRemoteTokens || ev.Prefill > maxRemoteTokens {
			r.ctr.drop("bad_field")
			return
		}
		rec := &selection.BookingRecord{ID: ev.ID, Partition: selection.PartitionKey{Model: ev.Model, Group: ev.Group},
			Rank: selection.Rank{WorkerID: ev.Worker, DPRank: ev.DPRank}, Hashes: ev.Hashes,
			PrefillTokens: ev.Prefill, Outputs: ev.Outputs, Session: ev.Session}
		switch remote.Reserve(origin, rec, r.cfg.MaxRemoteBookings) {
		case selection.RemoteOverBound:
			r.ctr.drop("over_bound")
		case selection.RemoteUnknownRank:
			r.ctr.drop("unknown_rank")
		}
	case kindPrefill:
		remote.PrefillCompleted(origin, ev.ID)
	case kindOutput:
		remote.OutputBlock(origin, ev.ID, ev.Decay)
	case kindFree:
		remote.Free(origin, ev.ID)
	case kindApprox:
		if len(ev.Hashes) > r.cfg.MaxHashes || len(ev.Model) > maxPartitionBytes || len(ev.Group) > maxPartitionBytes {
			r.ctr.drop("bad_field")
			return
		}
		if !r.router.RecordPeerBooking(selection.PartitionKey{Model: ev.Model, Group: ev.Group},
			selection.Rank{WorkerID: ev.Worker, DPRank: ev.DPRank}, ev.Hashes) {
			r.ctr.drop("unknown_rank")
			return
		}
		r.ctr.approxApplied.Add(1)
	case kindHealth:
		// Applied without r.mu's help but under it: the health tracker
		// takes its own lock and never calls back into the replica.
		r.router.Health().ObservedByPeer(ev.Worker, ev.Down)
		r.ctr.healthApplied.Add(1)
	default:
		r.ctr.drop("bad_field")
	}
}

// compareDigests compares the index digests a message carries (if any)
// with this replica's index now, outside r.mu (it walks the index): the
// entries counted on one side and not the other, summed over partitions,
// with a partition of equal counts but different contents counted as 1.
// Partitions over maxDigests or truncated on either side are skipped.
func (r *Replica) compareDigests(env *envelope) (uint64, bool) {
	var theirs []digest
	for i := range env.Events {
		if ev := &env.Events[i]; ev.Kind == kindHeartbeat && len(ev.Digests) > 0 {
			theirs = ev.Digests
		}
	}
	if len(theirs) == 0 || len(theirs) > maxDigests {
		return 0, false
	}
	ours := r.ourDigests()
	var diff uint64
	seen := make(map[string]bool, len(theirs))
	for _, t := range theirs {
		if len(t.Partition) > 2*maxPartitionBytes || seen[t.Partition] {
			continue
		}
		seen[t.Partition] = true
		o, ok := ours[t.Partition]
		switch {
		case ok && o.Truncated:
		case o.Entries != t.Entries:
			diff += max(o.Entries, t.Entries) - min(o.Entries, t.Entries)
		case o.Xor != t.Xor:
			diff++
		}
	}
	for name, o := range ours {
		if !seen[name] && !o.Truncated {
			diff += o.Entries
		}
	}
	return diff, true
}

// ourDigests is this replica's index digests by partition, walked from the
// index at most once a heartbeat: a walk of a 100k-entry index costs some
// 30 ms, and each message carrying digests asked for one (200 such
// messages, 14 KiB, held the subscription's goroutine for 6 s, and a live
// peer's heartbeats behind them let its lease run out). The map is read,
// never written, by its callers.
func (r *Replica) ourDigests() map[string]selection.IndexDigest {
	r.digestMu.Lock()
	defer r.digestMu.Unlock()
	if r.digests != nil && time.Since(r.digestsAt) < r.cfg.Heartbeat {
		return r.digests
	}
	r.digestWalks++
	ours := map[string]selection.IndexDigest{}
	for _, d := range r.router.Queries().IndexDigests() {
		ours[d.Partition] = d
	}
	r.digests, r.digestsAt = ours, time.Now()
	return ours
}
