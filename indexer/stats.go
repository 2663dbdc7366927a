package indexer

import (
	"math"
	"sync/atomic"
)

// Counter is a count that only this package adds to and anyone may read.
// It saturates at the largest uint64 instead of wrapping (addSat), so a
// hostile publisher cannot turn a huge count into a small one. A count of
// one publisher also adds to the total it is part of (up; Stats.part).
type Counter struct {
	n  atomic.Uint64
	up *Counter
}

// Load returns the count.
func (c *Counter) Load() uint64 { return c.n.Load() }

// add adds n, saturating, here and to the total. Adding 0 (a batch the
// index refused nothing of) touches neither.
func (c *Counter) add(n uint64) {
	if n == 0 {
		return
	}
	addSat(&c.n, n)
	if c.up != nil {
		addSat(&c.up.n, n)
	}
}

// addSat adds n to c, stopping at the largest uint64 rather than wrapping.
func addSat(c *atomic.Uint64, n uint64) {
	for {
		old := c.Load()
		if old == math.MaxUint64 {
			return
		}
		if c.CompareAndSwap(old, sumSat(old, n)) {
			return
		}
	}
}

// sumSat is a + b, or the largest uint64 where that would wrap.
func sumSat(a, b uint64) uint64 {
	if a+b < a {
		return math.MaxUint64
	}
	return a + b
}

// Stats are the live counters of what listeners saw, safe to read at any
// time: a manager's totals, or one publisher's counts (part). To report them, take
// a Snapshot (Manager.Snapshot), which also holds the index's figures.
type Stats struct {
	Messages    Counter // well-framed messages received live
	Batches     Counter // payloads applied (live or replayed)
	Malformed   Counter // frames or payloads that could not be used
	Stale       Counter // duplicates of already applied sequences
	Gaps        Counter // sequence jumps seen
	Replays     Counter // replay requests made
	Replayed    Counter // batches recovered by replay
	Lost        Counter // sequences that could not be recovered (at most MaxGap per gap)
	Restarts    Counter // publishers seen restarting (sequence went back)
	Rejected    Counter // events the index refused (unknown parent, token ids not filling the blocks)
	Jumps       Counter // live sequence jumps over MaxGap: taken as a restart, the rank's blocks dropped
	UnknownRank Counter // batches dropped: their dp_rank is not one of the worker's ranks
	// Disconnects counts connections to or from publishers that dropped:
	// the publisher went away or reset it, or (bind mode) did not greet
	// as a publisher in time. A listener on a libzmq SUB (an inproc://
	// endpoint, the connect-mode fallback) also counts here the
	// connections libzmq dropped for a message over MaxMessageBytes:
	// libzmq 4.3 reports both as ZMQ_EVENT_DISCONNECTED and no event
	// carries the reason. The gateway's own reader counts those in Cut.
	Disconnects Counter
	// Behind counts live batches applied two seconds or more later than
	// their publisher's other batches (lag.go): the listener is falling
	// behind, and its bounded queues will start to drop.
	Behind Counter
	// Cut counts publisher connections a listener cut off: a message of
	// more than three frames or over the message bound, a command over
	// 1 KiB or one too many inside a message (zmtpconn.go), or a bind-mode
	// peer that does not greet as a ZMTP 3 publisher with NULL security.
	Cut Counter
	// TurnedAway counts publisher connections a bind-mode listener
	// refused because it already held its bound of publishers.
	TurnedAway Counter
	// WrongTopic counts publisher connections a bind-mode listener cut
	// off for a topic they may not send under: a worker the catalog does
	// not know, a worker on another host, or a second topic on one
	// connection (topicguard.go).
	WrongTopic Counter
	// DialFailures counts connect-mode dials that did not end in a
	// subscription: the publisher refused or did not answer the dial, or
	// its greeting or handshake was not a ZMTP 3 publisher's with NULL
	// security. Only the first failure in a row is logged as a warning;
	// this count goes on, so a publisher the gateway cannot hear shows.
	DialFailures Counter
}

// EventCounts is a copy of Stats at one moment, as plain numbers.
type EventCounts struct {
	Messages, Batches, Malformed, Stale, Gaps, Replays, Replayed, Lost,
	Restarts, Rejected, Jumps, UnknownRank, Disconnects, Behind, Cut, TurnedAway, WrongTopic, DialFailures uint64
}

// all lists the counters, in EventCounts' order.
func (s *Stats) all() [18]*Counter {
	return [18]*Counter{&s.Messages, &s.Batches, &s.Malformed, &s.Stale, &s.Gaps, &s.Replays,
		&s.Replayed, &s.Lost, &s.Restarts, &s.Rejected, &s.Jumps, &s.UnknownRank,
		&s.Disconnects, &s.Behind, &s.Cut, &s.TurnedAway, &s.WrongTopic, &s.DialFailures}
}

// part returns counters of one publisher whose every add also adds to
// s, so that a count tells which publisher raised it and s the total.
func (s *Stats) part() *Stats {
	p := &Stats{}
	mine, totals := p.all(), s.all()
	for i, c := range mine {
		c.up = totals[i]
	}
	return p
}

// fields lists c's counts, in the order of Stats.all.
func (c *EventCounts) fields() [18]*uint64 {
	return [18]*uint64{&c.Messages, &c.Batches, &c.Malformed, &c.Stale, &c.Gaps, &c.Replays,
		&c.Replayed, &c.Lost, &c.Restarts, &c.Rejected, &c.Jumps, &c.UnknownRank,
		&c.Disconnects, &c.Behind, &c.Cut, &c.TurnedAway, &c.WrongTopic, &c.DialFailures}
}

// plus returns c with o's counts added (saturating).
func (c EventCounts) plus(o EventCounts) EventCounts {
	sum, add := c.fields(), o.fields()
	for i, p := range sum {
		*p = sumSat(*p, *add[i])
	}
	return c
}

// Counts copies the counters. Each is read atomically, the set is not:
// a batch applied during the copy may show in one counter and not yet in
// another, which a report of monotonic counters can live with.
func (s *Stats) Counts() EventCounts {
	var c EventCounts
	to := c.fields()
	for i, counter := range s.all() {
		*to[i] = counter.Load()
	}
	return c
}

// indexCounters are the index's own counters; IndexCounts copies them.
type indexCounters struct {
	applied       Counter // events applied
	skipped       Counter // events ignored by rule (other group, medium)
	unknownParent Counter // stores dropped: parent hash not indexed for the rank
	unknownBlock  Counter // removals of hashes the rank does not hold
	tokenCount    Counter // stores dropped: token ids are not blocks × block size
	// full counts blocks stored while the index held MaxEntries entries
	// already: each was indexed, and an older entry evicted for it.
	full Counter
	// evicted counts (block, rank) entries evicted to stay under
	// MaxEntries: the oldest of the ranks over their share (evict.go).
	evicted Counter
}

// IndexCounts is a copy of an index's size, bound and counters at one
// moment.
type IndexCounts struct {
	Entries    int64 // (block, rank) entries held
	MaxEntries int64 // the bound on Entries; 0 means none
	// The counters, as indexCounters describes them.
	Applied, Skipped, UnknownParent, UnknownBlock, TokenCount, Full, Evicted uint64
}

// Counts copies the index's figures (each read atomically, as Stats.Counts).
func (x *Index) Counts() IndexCounts {
	c := &x.counters
	return IndexCounts{
		Entries: x.Entries(), MaxEntries: x.MaxEntries,
		Applied: c.applied.Load(), Skipped: c.skipped.Load(), UnknownParent: c.unknownParent.Load(),
		UnknownBlock: c.unknownBlock.Load(), TokenCount: c.tokenCount.Load(),
		Full: c.full.Load(), Evicted: c.evicted.Load(),
	}
}

// Snapshot is everything a manager reports, copied at one moment: what
// /kv_router/stats and the kvrouter_* metrics render, through Figures.
type Snapshot struct {
	Listeners int // per-rank listeners running
	Events    EventCounts
	Index     IndexCounts
}

// Stats copies the manager's figures: the one way to read its counters.
func (m *Manager) Stats() Snapshot {
	return Snapshot{Listeners: m.Listeners(), Events: m.stats.Counts(), Index: m.Index.Counts()}
}
