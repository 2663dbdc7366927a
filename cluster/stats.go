package cluster

import "sync/atomic"

// Stats are a replica's counters since it started (docs/replicas.md,
// "Metrics"). Read them with Replica.Stats.
type Stats struct {
	Connected      bool
	Peers          int // other replicas heard within the lease
	RemoteBookings int // their bookings applied here
	// RemoteByReplica is RemoteBookings by the replica that made them.
	RemoteByReplica map[string]int
	// RemoteEvicted counts their bookings evicted so that a replica under
	// its fair share of the full table could book (docs/replicas.md).
	RemoteEvicted uint64
	SentMessages  uint64 // messages published
	SentBytes     uint64
	SentEvents    uint64
	RecvMessages  uint64 // messages read from other replicas
	RecvBytes     uint64
	// Dropped counts what was not sent or not applied, by reason:
	// queue_full, disconnected, publish_error (not sent); oversize,
	// malformed, over_bound, unknown_rank, bad_field (not applied).
	Dropped map[string]uint64
	// Refused counts messages from replicas whose settings fingerprint or
	// version differs from this one's, or that claim this replica's name.
	Refused map[string]uint64
	// LeaseExpiries counts replicas dropped because they went silent.
	LeaseExpiries uint64
	// EpochsReverted counts replicas followed again under an older epoch
	// after their newer one went silent for a lease (a forged or dead
	// process's epoch).
	EpochsReverted uint64
	// Outages counts losses of the NATS connection.
	Outages uint64
	// CatalogSynced is true while the catalog bucket is open and watched.
	CatalogSynced bool
	// CatalogPublished counts API catalog writes put in the bucket;
	// CatalogApplied the bucket's writes applied to this catalog;
	// CatalogUnavailable the times the bucket could not be opened (no
	// JetStream on the server).
	CatalogPublished, CatalogApplied, CatalogUnavailable uint64
	// HealthShared counts workers this replica took out or brought back
	// and told the others; HealthApplied the others' observations applied.
	HealthShared, HealthApplied uint64
	// ApproxApplied counts the others' approximate-index records applied
	// to this replica's index (approximate mode).
	ApproxApplied uint64
	// Announcements counts this replica's announcements of its bookings.
	Announcements uint64
	// DigestDiff is, per other replica, how far its prefix index was from
	// this one's at its last digest: the entries counted on one side and
	// not the other, summed over partitions (0: the same).
	DigestDiff map[string]uint64
}

// Drop and refusal reasons.
var (
	dropReasons = []string{"queue_full", "disconnected", "publish_error", "oversize", "malformed", "over_bound", "unknown_rank", "bad_field", "stale_epoch",
		"future_epoch", "slow_consumer", "catalog_oversize", "catalog_malformed", "catalog_rejected", "catalog_local"}
	refuseReasons = []string{"fingerprint", "version", "own_name"}
)

type counters struct {
	sentMessages, sentBytes, sentEvents, recvMessages, recvBytes atomic.Uint64
	leaseExpiries, outages, announcements, epochsReverted        atomic.Uint64
	catalogPublished, catalogApplied, catalogUnavailable         atomic.Uint64
	healthShared, healthApplied, approxApplied                   atomic.Uint64
	dropped                                                      map[string]*atomic.Uint64
	refused                                                      map[string]*atomic.Uint64
}

func newCounters() *counters {
	c := &counters{dropped: map[string]*atomic.Uint64{}, refused: map[string]*atomic.Uint64{}}
	for _, r := range dropReasons {
		c.dropped[r] = new(atomic.Uint64)
	}
	for _, r := range refuseReasons {
		c.refused[r] = new(atomic.Uint64)
	}
	return c
}

func (c *counters) drop(reason string)   { c.dropped[reason].Add(1) }
func (c *counters) refuse(reason string) { c.refused[reason].Add(1) }

func (c *counters) fill(s *Stats) {
	s.SentMessages, s.SentBytes, s.SentEvents = c.sentMessages.Load(), c.sentBytes.Load(), c.sentEvents.Load()
	s.RecvMessages, s.RecvBytes = c.recvMessages.Load(), c.recvBytes.Load()
	s.LeaseExpiries, s.Outages, s.Announcements = c.leaseExpiries.Load(), c.outages.Load(), c.announcements.Load()
	s.EpochsReverted = c.epochsReverted.Load()
	s.CatalogPublished, s.CatalogApplied, s.CatalogUnavailable = c.catalogPublished.Load(), c.catalogApplied.Load(), c.catalogUnavailable.Load()
	s.HealthShared, s.HealthApplied, s.ApproxApplied = c.healthShared.Load(), c.healthApplied.Load(), c.approxApplied.Load()
	s.Dropped, s.Refused = map[string]uint64{}, map[string]uint64{}
	for r, v := range c.dropped {
		s.Dropped[r] = v.Load()
	}
	for r, v := range c.refused {
		s.Refused[r] = v.Load()
	}
}
