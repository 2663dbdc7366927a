package caddymodule

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// The replicas' metrics (docs/replicas.md, "Metrics"), read from the
// running replica at scrape time; none without a cluster block.
var (
	clusterConnectedDesc = prometheus.NewDesc("kvrouter_cluster_connected",
		"1 while this replica reaches NATS and shares state with the others; 0 while it routes alone.", nil, nil)
	clusterPeersDesc = prometheus.NewDesc("kvrouter_cluster_peers",
		"Other replicas heard from within the lease.", nil, nil)
	clusterRemoteBookingsDesc = prometheus.NewDesc("kvrouter_cluster_remote_bookings",
		"Other replicas' bookings counted as load on this one.", nil, nil)
	clusterRemoteByReplicaDesc = prometheus.NewDesc("kvrouter_cluster_remote_bookings_by_replica",
		"Other replicas' bookings counted as load on this one, by the replica that made them.", []string{"replica"}, nil)
	clusterRemoteEvictedDesc = prometheus.NewDesc("kvrouter_cluster_remote_evicted_total",
		"Other replicas' bookings evicted from the full table so that a replica under its fair share of it could book.", nil, nil)
	clusterMessagesDesc = prometheus.NewDesc("kvrouter_cluster_messages_total",
		"NATS messages this replica sent or received, by direction.", []string{"direction"}, nil)
	clusterBytesDesc = prometheus.NewDesc("kvrouter_cluster_bytes_total",
		"NATS message bytes this replica sent or received, by direction.", []string{"direction"}, nil)
	clusterDroppedDesc = prometheus.NewDesc("kvrouter_cluster_dropped_total",
		"Events not sent or not applied, by reason (queue_full, disconnected, publish_error, oversize, malformed, over_bound, unknown_rank, bad_field, stale_epoch, future_epoch, slow_consumer; catalog_oversize, catalog_malformed, catalog_rejected for the catalog bucket).", []string{"reason"}, nil)
	clusterRefusedDesc = prometheus.NewDesc("kvrouter_cluster_refused_total",
		"Messages refused from replicas with other settings (fingerprint), another build (version) or this replica's name (own_name).", []string{"reason"}, nil)
	clusterLeaseExpiriesDesc = prometheus.NewDesc("kvrouter_cluster_lease_expiries_total",
		"Replicas whose bookings were dropped because they went silent for the lease.", nil, nil)
	clusterEpochsRevertedDesc = prometheus.NewDesc("kvrouter_cluster_epochs_reverted_total",
		"Replicas followed again under an older epoch after their newer one went silent for a lease (a forged epoch under their name, or a dead process's).", nil, nil)
	clusterDigestDiffDesc = prometheus.NewDesc("kvrouter_cluster_index_digest_difference",
		"How far another replica's prefix index was from this one's at its last digest (every tenth heartbeat): entries on one side and not the other, summed over partitions; 0 when they match.", []string{"replica"}, nil)
	clusterOutagesDesc = prometheus.NewDesc("kvrouter_cluster_outages_total",
		"Losses of the NATS connection (this replica routed alone until it returned).", nil, nil)
	clusterCatalogSyncedDesc = prometheus.NewDesc("kvrouter_cluster_catalog_synced",
		"1 while this replica watches the catalog bucket (workers registered through the API are shared); 0 while it cannot (NATS away, or no JetStream on the server).", nil, nil)
	clusterCatalogWritesDesc = prometheus.NewDesc("kvrouter_cluster_catalog_writes_total",
		"Catalog writes through the catalog bucket: published (this replica's API writes put in it) and applied (other replicas' writes applied here).", []string{"direction"}, nil)
	clusterHealthDesc = prometheus.NewDesc("kvrouter_cluster_health_observations_total",
		"Worker-health observations (a worker taken out or brought back): shared (this replica's own, told the others) and applied (the others', applied here).", []string{"direction"}, nil)
	clusterApproxAppliedDesc = prometheus.NewDesc("kvrouter_cluster_approx_records_applied_total",
		"Other replicas' approximate-index records (a booked prompt's blocks on a rank) applied to this replica's index (approximate mode).", nil, nil)
	clusterCatalogUnavailableDesc = prometheus.NewDesc("kvrouter_cluster_catalog_unavailable_total",
		"Connections on which the catalog bucket could not be opened (no JetStream on the server): bookings and leases were shared, API catalog writes were not.", nil, nil)
)

type clusterCollector struct{}

func (clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{clusterConnectedDesc, clusterPeersDesc, clusterRemoteBookingsDesc, clusterMessagesDesc,
		clusterBytesDesc, clusterDroppedDesc, clusterRefusedDesc, clusterLeaseExpiriesDesc, clusterOutagesDesc, clusterDigestDiffDesc,
		clusterCatalogSyncedDesc, clusterCatalogWritesDesc, clusterCatalogUnavailableDesc, clusterHealthDesc, clusterApproxAppliedDesc,
		clusterRemoteByReplicaDesc, clusterRemoteEvictedDesc, clusterEpochsRevertedDesc} {
		ch <- d
	}
}

func (clusterCollector) Collect(ch chan<- prometheus.Metric) {
	rep := runningReplica()
	if rep == nil {
		return
	}
	s := rep.Stats()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	connected := 0.0
	if s.Connected {
		connected = 1
	}
	gauge(clusterConnectedDesc, connected)
	gauge(clusterPeersDesc, float64(s.Peers))
	gauge(clusterRemoteBookingsDesc, float64(s.RemoteBookings))
	for name, n := range s.RemoteByReplica {
		gauge(clusterRemoteByReplicaDesc, float64(n), name)
	}
	counter(clusterRemoteEvictedDesc, s.RemoteEvicted)
	counter(clusterMessagesDesc, s.SentMessages, "sent")
	counter(clusterMessagesDesc, s.RecvMessages, "received")
	counter(clusterBytesDesc, s.SentBytes, "sent")
	counter(clusterBytesDesc, s.RecvBytes, "received")
	for r, v := range s.Dropped {
		counter(clusterDroppedDesc, v, r)
	}
	for r, v := range s.Refused {
		counter(clusterRefusedDesc, v, r)
	}
	counter(clusterLeaseExpiriesDesc, s.LeaseExpiries)
	counter(clusterEpochsRevertedDesc, s.EpochsReverted)
	counter(clusterOutagesDesc, s.Outages)
	synced := 0.0
	if s.CatalogSynced {
		synced = 1
	}
	gauge(clusterCatalogSyncedDesc, synced)
	counter(clusterCatalogWritesDesc, s.CatalogPublished, "published")
	counter(clusterCatalogWritesDesc, s.CatalogApplied, "applied")
	counter(clusterCatalogUnavailableDesc, s.CatalogUnavailable)
	counter(clusterHealthDesc, s.HealthShared, "shared")
	counter(clusterHealthDesc, s.HealthApplied, "applied")
	counter(clusterApproxAppliedDesc, s.ApproxApplied)
	for name, d := range s.DigestDiff {
		gauge(clusterDigestDiffDesc, float64(d), name)
	}
}

func registerClusterMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	err := reg.Register(clusterCollector{})
	var are prometheus.AlreadyRegisteredError
	if err != nil && !errors.As(err, &are) {
		return err
	}
	return nil
}
