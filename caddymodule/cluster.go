package caddymodule

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/zeebo/xxh3"
	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/cluster"
	"github.com/kvrouter/caddy-kvrouter/selection"
)

// ClusterConfig makes this gateway one replica of several that share their
// bookings and session leases over NATS (docs/replicas.md). Its field sits
// at the top level of the kv_router app (the struct is embedded).
type ClusterConfig struct {
	// Cluster, when set, joins the replicas on its NATS servers. Default:
	// unset (this gateway routes alone).
	Cluster *ClusterSettings `json:"cluster,omitempty"`
}

// ClusterSettings are one replica's link to the others.
type ClusterSettings struct {
	// URLs are the NATS servers (nats://host:4222, tls://host:4222); the
	// client moves to another when one fails. Required.
	URLs []string `json:"urls"`

	// Name identifies this replica to the others: letters, digits, - and
	// _, at most 64 bytes, unique per replica. Default: the host name.
	Name string `json:"name,omitempty"`

	// Prefix heads every subject the replicas publish and read
	// (<prefix>.r.<name>): dot-separated tokens of letters, digits, - and
	// _. Replicas of one fleet share it; another fleet on the same NATS
	// account uses another. Default: "kvrouter".
	Prefix string `json:"prefix,omitempty"`

	// Credentials is a NATS credentials file (a user JWT and its seed),
	// for an account only the replicas hold. Default: none.
	Credentials string `json:"credentials,omitempty"`

	// TLSCA is a PEM file of the CA that signs the NATS servers'
	// certificates. Default: the system's roots (with tls:// URLs).
	TLSCA string `json:"tls_ca,omitempty"`

	// TLSCert and TLSKey are PEM files of this replica's client
	// certificate and key, for servers that verify clients. Default: none.
	TLSCert string `json:"tls_cert,omitempty"`
	TLSKey  string `json:"tls_key,omitempty"`

	// Heartbeat is how often this replica tells the others it is alive.
	// At least 10ms. Default: 1s.
	Heartbeat caddy.Duration `json:"heartbeat,omitempty"`

	// Lease is how long a replica's bookings count on the others after its
	// last message: a replica that dies stops counting this long after.
	// At least twice the heartbeat. Default: 3s.
	Lease caddy.Duration `json:"lease,omitempty"`

	// MaxRemoteBookings bounds the bookings one other replica may hold on
	// this one; past it they are dropped and counted. Default: 65536.
	MaxRemoteBookings int `json:"max_remote_bookings,omitempty"`

	// MaxRemoteBlocks bounds the prompt blocks the bookings of one other
	// replica may hold on this one (each kept, 8 bytes, while it lives);
	// past it they are dropped and counted. Default: 4194304.
	MaxRemoteBlocks int `json:"max_remote_blocks,omitempty"`

	// MaxMessageBytes bounds a message sent or read; a larger one read is
	// dropped and counted. At least 1024, and room for one booking of
	// max_hashes. Default: 262144 (256 KiB).
	MaxMessageBytes int `json:"max_message_bytes,omitempty"`

	// MaxHashes bounds the prompt blocks a booking carries to the others;
	// a longer prompt's are cut to this prefix. Default: 4096.
	MaxHashes int `json:"max_hashes,omitempty"`

	// QueueLength bounds the events waiting to be published; past it they
	// are dropped, counted, and this replica announces its bookings anew.
	// Default: 65536.
	QueueLength int `json:"queue_length,omitempty"`

	// MaxCatalogValueBytes bounds one worker's entry in the catalog bucket
	// (a worker registered through the selection API, shared with every
	// replica): a larger write stays on this replica, a larger entry read
	// is dropped, both counted. At least 1024. Default: 65536 (64 KiB).
	MaxCatalogValueBytes int `json:"max_catalog_value_bytes,omitempty"`
}

// validate checks the settings without connecting.
func (c *ClusterConfig) validate(fingerprint uint64) error {
	if c.Cluster == nil {
		return nil
	}
	_, err := c.Cluster.config(fingerprint, nil)
	return err
}

// config is the cluster package's configuration for these settings.
func (s *ClusterSettings) config(fingerprint uint64, log *zap.Logger) (cluster.Config, error) {
	if len(s.URLs) == 0 {
		return cluster.Config{}, errors.New("cluster: at least one NATS URL is needed")
	}
	for _, u := range s.URLs {
		if !strings.Contains(u, "://") {
			return cluster.Config{}, fmt.Errorf("cluster: %q is not a URL (nats://host:port)", u)
		}
	}
	name := s.Name
	if name == "" {
		host, err := os.Hostname()
		if err != nil {
			return cluster.Config{}, fmt.Errorf("cluster: no name given and no host name: %v", err)
		}
		name = host
	}
	if (s.TLSCert == "") != (s.TLSKey == "") {
		return cluster.Config{}, errors.New("cluster: tls_cert and tls_key go together")
	}
	cfg := cluster.Config{URLs: s.URLs, Name: name, Prefix: s.Prefix, Credentials: s.Credentials,
		TLSCA: s.TLSCA, TLSCert: s.TLSCert, TLSKey: s.TLSKey,
		Heartbeat: time.Duration(s.Heartbeat), Lease: time.Duration(s.Lease),
		MaxRemoteBookings: s.MaxRemoteBookings, MaxRemoteBlocks: s.MaxRemoteBlocks, MaxMessageBytes: s.MaxMessageBytes,
		MaxHashes: s.MaxHashes, QueueLength: s.QueueLength, MaxCatalogValueBytes: s.MaxCatalogValueBytes,
		Fingerprint: fingerprint, Version: buildVersion(), Logger: log}
	return cluster.Validate(cfg)
}

// clusterLink is the running replica. It outlives a config reload that
// keeps the same cluster settings and fingerprint (Caddy starts the new
// config before it stops the old, and two replicas of one name on one
// router would fight over its remote bookings); other settings replace it.
// A replaced link's config is still running until the new config's load
// commits: a load that fails after its kv_router app started (another app
// failing to start, or the replica itself) stops the new link and opens
// the replaced one again. Closed for good, the running config stayed off
// NATS, and posting it again was "config is unchanged".
type clusterLink struct {
	key    string // the settings and fingerprint it was started with
	rep    *cluster.Replica
	refs   int // configs holding it
	router *selection.Router
	cfg    cluster.Config
	// replaced is the link this one closed when it started, until either
	// stops; its config may still be running.
	replaced *clusterLink
}

var (
	linkMu sync.Mutex
	link   *clusterLink
)

// start joins the replicas, or keeps the running replica when its
// settings are these; nil without a cluster block. A NATS server that is
// not up yet is retried in the background: the gateway routes alone until
// then.
func (c *ClusterConfig) start(router *selection.Router, fingerprint uint64, log *zap.Logger) (*clusterLink, error) {
	linkMu.Lock()
	defer linkMu.Unlock()
	if c.Cluster == nil {
		return nil, nil
	}
	js, _ := json.Marshal(c.Cluster)
	key := fmt.Sprintf("%x/%s", fingerprint, js)
	if link != nil && link.key == key {
		link.refs++
		return link, nil
	}
	cfg, err := c.Cluster.config(fingerprint, log)
	if err != nil {
		return nil, err
	}
	prev := link
	if prev != nil {
		prev.rep.Close() // its config, still running, keeps a closed link until it stops or this load fails
		prev.replaced = nil
		link = nil
	}
	rep, err := cluster.Start(router, cfg)
	if err != nil {
		prev.reopen()
		return nil, fmt.Errorf("joining the replicas: %v", err)
	}
	link = &clusterLink{key: key, rep: rep, refs: 1, router: router, cfg: cfg, replaced: prev}
	return link, nil
}

// reopen starts l's replica again when a config still holds l: the load
// that replaced it failed. linkMu is held; a nil link has nothing to open.
func (l *clusterLink) reopen() {
	if l == nil || l.refs == 0 {
		return
	}
	rep, err := cluster.Start(l.router, l.cfg)
	if err != nil {
		if l.cfg.Logger != nil {
			l.cfg.Logger.Error("rejoining the replicas after a failed load", zap.Error(err))
		}
		return
	}
	l.rep, link = rep, l
}

// stop lets go of l; the last config holding it closes the replica.
func (l *clusterLink) stop() {
	if l == nil {
		return
	}
	linkMu.Lock()
	defer linkMu.Unlock()
	if l.refs--; l.refs == 0 {
		l.rep.Close()
		if link == l {
			link = nil
			l.replaced.reopen() // still held: this link's load failed
		}
		l.replaced = nil
	}
}

// runningReplica is the replica of the running config, for the metrics;
// nil when there is none.
func runningReplica() *cluster.Replica {
	linkMu.Lock()
	defer linkMu.Unlock()
	if link == nil {
		return nil
	}
	return link.rep
}

// settingsFingerprint names the routing settings replicas must share: the
// app's config without what is local to each (its declared workers, its
// discovery, its engine reading, its cluster link).
func (a *App) settingsFingerprint() uint64 {
	shared := *a
	shared.Workers = nil
	shared.DiscoveryConfig = DiscoveryConfig{}
	shared.EngineFactsConfig = EngineFactsConfig{}
	shared.ClusterConfig = ClusterConfig{}
	data, err := json.Marshal(&shared)
	if err != nil {
		return 0
	}
	return xxh3.Hash(data)
}

// buildVersion is this module's version as built (a tag, a pseudo-version
// or "(devel)"): replicas of different builds refuse each other.
func buildVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	const path = "github.com/kvrouter/caddy-kvrouter"
	if info.Main.Path == path {
		return info.Main.Version
	}
	for _, dep := range info.Deps {
		if dep.Path == path {
			return dep.Version
		}
	}
	return "unknown"
}
