package cluster

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Replica links one router to the other replicas. Start it with Start and
// stop it with Close; the router routes on its own (with only its own
// bookings) before, after, and while NATS is unreachable.
type Replica struct {
	cfg     Config
	router  *selection.Router
	nc      *nats.Conn
	sub     *nats.Subscription
	subject string // this replica's: <prefix>.r.<name>
	ctr     *counters
	cat     *catalogSync // the catalog bucket (catalog.go)
	log     *zap.Logger

	queue chan event    // own booking events, to publish in order
	wake  chan struct{} // a flag below was set
	// Work for the publisher, set from any goroutine.
	announceWanted, helloWanted, heartbeatWanted atomic.Bool
	// digests are this replica's index digests as last walked, at
	// digestsAt (ourDigests); digestWalks counts the walks.
	digestMu    sync.Mutex
	digests     map[string]selection.IndexDigest
	digestsAt   time.Time
	digestWalks int
	// announcedAt and helloAt are when the publisher last announced and
	// said hello (its goroutine's alone): each at most once a heartbeat.
	announcedAt, helloAt time.Time
	connected, closing   atomic.Bool
	// startTold is set once NATS was first reached, or its first failure
	// told (notReached).
	startTold atomic.Bool
	epoch     uint64 // the publisher's alone

	mu        sync.Mutex
	peers     map[string]*peer
	refusedAt map[string]bool // origins whose refusal was logged (bounded by maxPeers)

	stop  chan struct{}
	wg    sync.WaitGroup
	beats int // heartbeats sent, the publisher's alone
}

// peer is what this replica knows of another.
type peer struct {
	epoch    uint64
	lastSeen time.Time
	lease    time.Duration // its own, as its last message said (leaseOf)
	// digestDiff is how far its index was from ours at its last digest.
	digestDiff uint64
}

// Bounds on what peers control that the config does not name.
const (
	maxPeers = 256 // replicas followed at once
	// maxPeerLease bounds the lease a peer's messages may claim: a silent
	// peer's bookings go after it at the latest.
	maxPeerLease      = 10 * time.Minute
	maxEventsPerEnv   = 4096
	maxIDBytes        = 128
	maxSessionBytes   = 256
	maxPartitionBytes = 256
	maxBatchEvents    = 1024
	maxDigests        = 256 // partitions a heartbeat summarises
	// maxRemoteTokens bounds a remote booking's prefill tokens and output
	// blocks, as the selection API bounds isl_tokens: a peer's 2^64 - 1
	// wrapped a rank's prefill sum to near 0, and 2^62 outputs rounded the
	// rank's other decode blocks away for good.
	maxRemoteTokens = 1 << 24
	// maxEpochAhead is how far ahead of this replica's clock a peer's
	// epoch may be (clocks differ between hosts).
	maxEpochAhead   = time.Hour
	digestEvery     = 10 // heartbeats between index digests
	subPendingMsgs  = 8192
	subPendingBytes = 64 << 20
)

// Start connects to NATS (retrying in the background while it is
// unreachable), hooks into router and begins exchanging state.
func Start(router *selection.Router, cfg Config) (*Replica, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &Replica{cfg: cfg, router: router, ctr: newCounters(), log: cfg.Logger,
		subject: cfg.Prefix + ".r." + cfg.Name,
		queue:   make(chan event, cfg.QueueLength), wake: make(chan struct{}, 1),
		peers: map[string]*peer{}, refusedAt: map[string]bool{}, stop: make(chan struct{}),
		// Epochs count on from the start's clock, so that a replica that
		// comes back under its name (a restart, a reload that makes a new
		// link) announces epochs above its previous process's: counted
		// from 0 each time, a new process announced the old one's epoch,
		// and the others kept the dead process's bookings for good.
		epoch: uint64(time.Now().UnixNano())}
	r.cat = newCatalogSync(r)
	opts := []nats.Option{
		nats.Name("kvrouter-" + cfg.Name),
		nats.NoEcho(), // a replica's own messages are not news to it
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(-1), // nothing is queued while away: the announcement on return replaces it
		nats.PingInterval(cfg.Lease),
		nats.MaxPingsOutstanding(2),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { r.lost() }),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) { r.notReached(err) }),
		nats.ReconnectHandler(r.back),
		nats.ConnectHandler(r.back),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { r.asyncError(err) }),
	}
	if cfg.Credentials != "" {
		opts = append(opts, nats.UserCredentials(cfg.Credentials))
	}
	if cfg.TLSCA != "" {
		opts = append(opts, nats.RootCAs(cfg.TLSCA))
	}
	if cfg.TLSCert != "" {
		opts = append(opts, nats.ClientCert(cfg.TLSCert, cfg.TLSKey))
	}
	r.nc, err = nats.Connect(strings.Join(cfg.URLs, ","), opts...)
	if err != nil {
		return nil, err
	}
	r.sub, err = r.nc.Subscribe(cfg.Prefix+".r.*", r.receive)
	if err != nil {
		r.nc.Close()
		return nil, err
	}
	_ = r.sub.SetPendingLimits(subPendingMsgs, subPendingBytes)
	if r.nc.IsConnected() {
		// The subscription is in place at the server when Start returns:
		// a message published just after it (another replica's, a test's)
		// is not lost to the race between the two connections.
		_ = r.nc.FlushTimeout(time.Second)
	}
	router.Remote().SetMaxBlocksPerOrigin(cfg.MaxRemoteBlocks)
	router.SetReplicaSink(r)
	router.Catalog().SetSink(r)
	router.Health().SetSink(r)
	router.SetApproxSink(r)
	r.wg.Go(r.publish)
	r.wg.Go(r.cat.run)
	r.wg.Go(r.tick)
	if r.nc.IsConnected() {
		r.back(r.nc)
	}
	return r, nil
}

// Close stops exchanging state, drops the other replicas' bookings and
// closes the NATS connection.
func (r *Replica) Close() {
	if r.closing.Swap(true) {
		return
	}
	r.router.ClearReplicaSink(r)
	r.router.Catalog().ClearSink(r)
	r.router.Health().ClearSink(r)
	r.router.ClearApproxSink(r)
	close(r.stop)
	r.wg.Wait()
	r.nc.Close()
	r.mu.Lock()
	r.peers = map[string]*peer{}
	r.mu.Unlock()
	r.router.Remote().DropAll()
}

// Stats returns the counters and the current state.
func (r *Replica) Stats() Stats {
	var s Stats
	r.ctr.fill(&s)
	s.Connected = r.connected.Load()
	s.CatalogSynced = r.cat.open.Load()
	r.mu.Lock()
	s.Peers = len(r.peers)
	s.DigestDiff = make(map[string]uint64, len(r.peers))
	for name, p := range r.peers {
		s.DigestDiff[name] = p.digestDiff
	}
	r.mu.Unlock()
	s.RemoteBookings = r.router.Remote().Total()
	s.RemoteByReplica = r.router.Remote().Counts()
	s.RemoteEvicted = r.router.Remote().Evicted()
	return s
}

// asyncError is told what NATS reports outside a call: a subscription
// whose pending messages passed their bound (subPendingMsgs,
// subPendingBytes) has lost some, which the other replicas' next
// announcements repair, so it is counted and a hello asks for them.
func (r *Replica) asyncError(err error) {
	if errors.Is(err, nats.ErrSlowConsumer) {
		r.ctr.drop("slow_consumer")
		r.helloWanted.Store(true)
		r.poke()
	}
}

// lost runs when the connection drops: this replica routes alone until it
// returns, so the others' bookings, which it can no longer follow, go.
func (r *Replica) lost() {
	if r.closing.Load() || !r.connected.Swap(false) {
		return
	}
	r.ctr.outages.Add(1)
	r.cat.open.Store(false)
	r.mu.Lock()
	r.dropPeersLocked()
	r.mu.Unlock()
	r.log.Warn("NATS unreachable: this replica routes alone, with its own bookings only, until it returns",
		zap.String("replica", r.cfg.Name))
}

// notReached runs when an attempt to reach NATS fails. Once the link is
// up, its loss is lost's to tell; before it ever was (NATS away at start,
// a wrong address), nothing else says so: the first failure is logged and
// counted as an outage, once.
func (r *Replica) notReached(err error) {
	if r.closing.Load() || r.connected.Load() || r.startTold.Swap(true) {
		return
	}
	r.ctr.outages.Add(1)
	r.log.Warn("NATS unreachable: this replica routes alone, with its own bookings only, until it connects",
		zap.String("replica", r.cfg.Name), zap.Error(err))
}

// back runs when the connection is made or made again: announce our live
// bookings and ask the others to announce theirs.
func (r *Replica) back(nc *nats.Conn) {
	if r.closing.Load() || r.connected.Swap(true) {
		return
	}
	r.startTold.Store(true)
	r.log.Info("NATS reachable: exchanging bookings with the other replicas", zap.String("replica", r.cfg.Name),
		zap.String("server", nc.ConnectedUrlRedacted()))
	r.announceWanted.Store(true)
	r.helloWanted.Store(true)
	r.poke()
	r.cat.reopen.Store(true) // watch the bucket afresh: its replay brings what changed while away
	r.cat.poke()
}

func (r *Replica) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *Replica) dropPeersLocked() {
	for origin := range r.peers {
		r.router.Remote().DropOrigin(origin)
	}
	r.peers = map[string]*peer{}
}

// tick asks for a heartbeat every Heartbeat, and drops each replica when
// its lease runs out: one timer, armed at the earliest lastSeen+lease of
// the peers (or a lease from now when there are none, which no peer heard
// later can expire before), so a silent replica's bookings stop counting
// at its lease, to the timer's precision (a millisecond or so), not at the
// next check.
func (r *Replica) tick() {
	beat := time.NewTicker(r.cfg.Heartbeat)
	defer beat.Stop()
	deadline := time.NewTimer(r.cfg.Lease)
	defer deadline.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-beat.C:
			r.heartbeatWanted.Store(true)
			r.poke()
		case now := <-deadline.C:
			next := r.expire(now)
			deadline.Reset(time.Until(next))
		}
	}
}

// expire drops the bookings of every replica silent for the lease or
// longer, and returns when the next lease of those left runs out.
func (r *Replica) expire(now time.Time) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := now.Add(r.cfg.Lease)
	for origin, p := range r.peers {
		end := p.lastSeen.Add(p.lease)
		if !now.Before(end) {
			n := r.router.Remote().DropOrigin(origin)
			delete(r.peers, origin)
			r.ctr.leaseExpiries.Add(1)
			r.log.Warn("replica silent past its lease: its bookings are dropped",
				zap.String("replica", origin), zap.Int("bookings", n), zap.Duration("lease", p.lease))
			continue
		}
		if end.Before(next) {
			next = end
		}
	}
	return next
}
