// Package cluster shares a gateway's state with its other replicas over
// NATS (docs/replicas.md): every replica publishes its own booking
// lifecycle and heartbeats under a subject prefix, and applies the others'
// bookings as load on its own router (selection.RemoteBookings). A replica
// that goes silent has its bookings dropped after the lease; while NATS is
// unreachable each replica routes alone, and on its return they announce
// their live bookings again.
package cluster

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Defaults and bounds (docs/replicas.md).
const (
	DefaultPrefix            = "kvrouter"
	DefaultHeartbeat         = time.Second
	DefaultLease             = 3 * time.Second
	DefaultMaxRemoteBookings = 65536
	// DefaultMaxRemoteBlocks bounds the prompt blocks one other replica's
	// bookings hold here: a client's own bound on one replica
	// (selection's max_reservation_blocks_per_client), about 34 MiB.
	DefaultMaxRemoteBlocks = 4 << 20
	DefaultMaxMessageBytes = 256 << 10
	DefaultMaxHashes       = 4096
	DefaultQueueLength     = 65536
	// DefaultMaxCatalogValueBytes bounds one worker's entry in the catalog
	// bucket: a registration is a few hundred bytes, its maps and lists
	// are bounded by the catalog's field bounds.
	DefaultMaxCatalogValueBytes = 64 << 10
	// maxNameBytes bounds a replica name: it is a subject token and a map
	// key on every peer.
	maxNameBytes = 64
)

// Config is one replica's link to the others.
type Config struct {
	// URLs are the NATS servers, nats://host:port (tls:// for TLS).
	URLs []string
	// Name identifies this replica to the others; unique per replica.
	Name string
	// Prefix heads every subject this replica publishes and reads.
	Prefix string
	// Credentials is a NATS credentials file (JWT and seed); "" for none.
	Credentials string
	// TLSCA, TLSCert and TLSKey are PEM files: the CA that signs the
	// servers' certificates, and this replica's client certificate.
	TLSCA, TLSCert, TLSKey string
	// Heartbeat is how often this replica says it is alive.
	Heartbeat time.Duration
	// Lease is how long a replica's bookings outlive its last message.
	Lease time.Duration
	// MaxRemoteBookings bounds the bookings one other replica may hold here.
	MaxRemoteBookings int
	// MaxRemoteBlocks bounds the prompt blocks those bookings hold.
	MaxRemoteBlocks int
	// MaxMessageBytes bounds a message, sent or received.
	MaxMessageBytes int
	// MaxHashes bounds the tracking hashes a booking carries; a longer
	// prompt's are cut to this prefix (its later blocks count on the
	// others as not shared, which is what they are for most prompts).
	MaxHashes int
	// QueueLength bounds the events waiting to be published.
	QueueLength int
	// MaxCatalogValueBytes bounds one worker's entry in the catalog bucket,
	// written or read; a larger one is dropped and counted.
	MaxCatalogValueBytes int
	// Fingerprint and Version name the routing settings and the build;
	// messages from a replica whose differ are refused.
	Fingerprint uint64
	Version     string
	Logger      *zap.Logger
}

// Validate returns c with its defaults filled in, or why it cannot run.
func Validate(c Config) (Config, error) { return c.withDefaults() }

// withDefaults fills unset fields and checks the rest.
func (c Config) withDefaults() (Config, error) {
	if len(c.URLs) == 0 {
		return c, errors.New("cluster: at least one NATS URL is needed")
	}
	if err := checkToken("name", c.Name); err != nil {
		return c, err
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	for _, tok := range strings.Split(c.Prefix, ".") {
		if err := checkToken("prefix", tok); err != nil {
			return c, err
		}
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.Heartbeat < 10*time.Millisecond {
		return c, errors.New("cluster: heartbeat must be at least 10ms")
	}
	if c.Lease < 2*c.Heartbeat {
		return c, fmt.Errorf("cluster: lease (%v) must be at least twice the heartbeat (%v)", c.Lease, c.Heartbeat)
	}
	if c.MaxRemoteBlocks == 0 {
		c.MaxRemoteBlocks = DefaultMaxRemoteBlocks
	}
	if c.MaxRemoteBookings == 0 {
		c.MaxRemoteBookings = DefaultMaxRemoteBookings
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.MaxHashes == 0 {
		c.MaxHashes = DefaultMaxHashes
	}
	if c.QueueLength == 0 {
		c.QueueLength = DefaultQueueLength
	}
	if c.MaxCatalogValueBytes == 0 {
		c.MaxCatalogValueBytes = DefaultMaxCatalogValueBytes
	}
	if c.MaxCatalogValueBytes < 1024 {
		return c, errors.New("cluster: max_catalog_value_bytes must be at least 1024")
	}
	if c.MaxRemoteBookings < 0 || c.MaxRemoteBlocks < 0 || c.MaxMessageBytes < 1024 || c.MaxHashes < 0 || c.QueueLength < 1 {
		return c, errors.New("cluster: max_remote_bookings, max_hashes and queue_length must be positive, max_message_bytes at least 1024")
	}
	if c.MaxHashes*9+1024 > c.MaxMessageBytes {
		return c, fmt.Errorf("cluster: max_message_bytes (%d) cannot carry one booking of max_hashes (%d)", c.MaxMessageBytes, c.MaxHashes)
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c, nil
}

// checkToken refuses what cannot be one NATS subject token.
func checkToken(what, s string) error {
	if s == "" || len(s) > maxNameBytes {
		return fmt.Errorf("cluster: %s must be 1 to %d bytes", what, maxNameBytes)
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Errorf("cluster: %s %q may hold only letters, digits, - and _", what, s)
		}
	}
	return nil
}
