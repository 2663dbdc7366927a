package caddymodule

import (
	"context"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// removeAfterMisses is how many answers in a row must lack a worker's
// record before the worker is deleted: two, so that one answer that
// missed a server (a pod briefly unready, a partial answer) does not
// drop its cache and bookings. A worker leaves between one and two
// refreshes after its record did; a failed resolution counts for nothing.
const removeAfterMisses = 2

// discoverer follows a config's discovered names from App.Start to Stop:
// one goroutine per name resolves it every refresh and brings the
// catalog in line with the answer, through the catalog's usual writes
// (its bounds and the self-endpoint check apply).
type discoverer struct {
	catalog   *selection.Catalog
	ledger    *discoveryLedger
	blockSize uint32 // the app's block_size, the default of the workers' own
	log       *zap.Logger
	watches   []*nameWatch
	ctx       context.Context // the goroutines' and their lookups', ended by stop
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	now       func() time.Time // tests move it on
	gen       uint64           // this discoverer's number, unique in the process
}

// discovererGen numbers discoverers.
var discovererGen atomic.Uint64

// emptyGrace is how long a name must have had no records, answer after
// answer, before its workers leave. Counted in answers alone, two
// NXDOMAINs a refresh apart (a resolver answering NXDOMAIN half the time,
// at refresh 1s) dropped the fleet, and its caches and bookings with it;
// a Service scaled to zero is not in a hurry.
const emptyGrace = 30 * time.Second

// nameWatch is one name. Apart from its settings and resolver, its fields
// belong to its goroutine.
type nameWatch struct {
	dnsSettings
	resolver *net.Resolver
	targets  *targetResolver // SRV targets' addresses
	failing  bool            // the last resolution failed (and was logged)
	emptied  bool            // the last answer had no records (and was logged)
	over     bool            // the last answer was past max_workers (and was logged)
	unusable bool            // the last answer had unusable addresses (and was logged)
	// targetsFailing: the last answer had SRV targets whose lookup failed
	// (and was logged).
	targetsFailing bool
	warned         map[uint64]string // per worker id, the skip last logged, so each is logged once
	// again asks for a resolution now: the config writes again after a
	// newer one's load failed (buffered: one pending request is enough).
	again chan struct{}
}

// start starts following the names. It always joins the catalog's ledger,
// even with no name to follow, so that the workers of names an earlier
// config followed and this one does not are deleted, as a worker removed
// from the Caddyfile is; nil only without a catalog.
func (c *DiscoveryConfig) start(catalog *selection.Catalog, blockSize uint32, logger *zap.Logger) *discoverer {
	d := c.join(catalog, blockSize, logger)
	if d != nil {
		for _, w := range d.watches {
			d.wg.Go(func() { d.follow(d.ctx, w) })
		}
	}
	return d
}

// join makes the config's discoverer, the catalog's writer from now on,
// and deletes the workers of names it does not follow; its goroutines
// are not started (tests drive its refreshes themselves).
func (c *DiscoveryConfig) join(catalog *selection.Catalog, blockSize uint32, logger *zap.Logger) *discoverer {
	if catalog == nil {
		return nil
	}
	settings, err := c.settings()
	if err != nil {
		logger.Error("DNS discovery not started", zap.Error(err)) // Provision refuses such a config
		return nil
	}
	d := &discoverer{catalog: catalog, ledger: ledgerFor(catalog), blockSize: blockSize, log: logger, now: time.Now,
		gen: discovererGen.Add(1)}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	for _, s := range settings {
		r := newResolver(s.resolver)
		d.watches = append(d.watches, &nameWatch{dnsSettings: s, resolver: r, targets: newTargetResolver(s.resolver, r),
			warned: map[uint64]string{}, again: make(chan struct{}, 1)})
	}
	d.ledger.joining.Add(1)
	d.ledger.mu.Lock()
	d.ledger.joining.Add(-1)
	d.ledger.running = append(d.ledger.running, d)
	d.sweepLocked()
	d.ledger.recount()
	d.ledger.mu.Unlock()
	return d
}

// stop stops the goroutines, their lookups cancelled, and waits for them.
// The workers stay: the next config takes them over, or deletes them if
// it follows their names no more.
func (d *discoverer) stop() {
	if d == nil {
		return
	}
	d.halt()
	d.ledger.leave(d)
}

// resolveAgain asks each of d's names to be resolved now.
func (d *discoverer) resolveAgain() {
	for _, w := range d.watches {
		select {
		case w.again <- struct{}{}:
		default: // one pending request is enough
		}
	}
}

// halt stops the goroutines and waits for them, and leaves the ledger as
// it is: stop, later, hands the catalog over.
func (d *discoverer) halt() {
	if d == nil {
		return
	}
	d.cancel()
	d.wg.Wait()
}

// follow resolves w's name now and every refresh until ctx ends.
func (d *discoverer) follow(ctx context.Context, w *nameWatch) {
	t := time.NewTicker(w.refresh)
	defer t.Stop()
	for {
		d.refresh(ctx, w)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.again:
		}
	}
}

// refresh resolves w's name once and applies the answer. A config that is
// not the writer (an older one during a reload) does not even resolve.
func (d *discoverer) refresh(ctx context.Context, w *nameWatch) {
	d.ledger.mu.Lock()
	writing := d.ledger.writer() == d
	known := d.ledger.known(w.key)
	d.ledger.mu.Unlock()
	if !writing {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, min(w.refresh, resolveTimeout))
	ans, err := w.resolve(rctx, w.resolver, w.targets, known)
	cancel()
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		w.failed(d.log, err, len(known.endpoints))
		return
	}
	w.answered(d.log, &ans)
	d.apply(ctx, w, &ans)
}

// apply brings w's workers in line with an answer: a new server is added,
// a changed one updated, and one the answers have lacked
// removeAfterMisses times in a row deleted.
func (d *discoverer) apply(ctx context.Context, w *nameWatch, ans *answer) {
	l := d.ledger
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.writer() != d {
		return
	}
	defer l.recount()
	// The name's graces are the ledger's, so that a reload carries them
	// on: kept by each config, a reload every 20 s kept a name without
	// records at its workers for good.
	mem := l.memoryOf(w.key)
	if !ans.empty {
		mem.emptySince = time.Time{}
	} else if now := d.now(); mem.emptySince.IsZero() || now.Sub(mem.emptySince) < emptyGrace {
		if mem.emptySince.IsZero() {
			mem.emptySince = now
		}
		return // no records, not yet for long: the workers stay
	}
	mem.events.hold(w.eventsSRV, ans.specs, func(s *workerSpec) *uint16 { return &s.eventsPort })
	mem.replay.hold(w.replaySRV, ans.specs, func(s *workerSpec) *uint16 { return &s.replayPort })
	// endpoint → the id of the catalog worker there, one discovery did
	// not make first: a declared or registered worker's endpoint is its
	// own, whatever discovery made there meanwhile.
	holders := map[string]uint64{}
	for _, rec := range d.catalog.ListWorkers("", "") {
		ep := recordEndpoint(&rec)
		if ep == "" {
			continue
		}
		if _, set := holders[ep]; !set || l.owned[rec.WorkerID] == nil {
			holders[ep] = rec.WorkerID
		}
	}
	want := make(map[uint64]bool, len(ans.specs))
	for i := range ans.specs {
		want[discoveredID(w.key, ans.specs[i].endpoint())] = true
	}
	// Workers the answers have just lost stay for removeAfterMisses
	// answers, and count against max_workers meanwhile: a name whose
	// every answer was a new set of max_workers servers held twice
	// max_workers (512 at the default), with their listeners. Those that
	// reach it leave first, so that their places go to the answer's new
	// servers at once (left for after the adds, a new set at every answer
	// left the name without workers one answer in three). A target whose
	// lookup failed keeps its workers: the answer says nothing of it.
	held := 0
	for _, id := range slices.Sorted(maps.Keys(l.owned)) {
		o := l.owned[id]
		if o.name != w.key {
			continue
		}
		if !want[id] && !ans.failedTargets[o.spec.target] {
			if o.misses++; o.misses >= removeAfterMisses {
				d.removeLocked(id, o, "its record went away")
				continue
			}
		}
		held++
	}
	for i := range ans.specs {
		if ctx.Err() != nil || l.joining.Load() > 0 {
			return // stopping, or another config is starting: it carries on from here
		}
		spec := &ans.specs[i]
		id := discoveredID(w.key, spec.endpoint())
		if l.owned[id] == nil {
			if held >= w.maxWorkers {
				d.skip(w, id, spec, "over_max_workers", "the name holds max_workers workers, some of which its answers have just lost; this server waits until they leave")
				continue
			}
			held++
		}
		d.ensureLocked(w, id, spec, holders)
	}
	maps.DeleteFunc(w.warned, func(id uint64, _ string) bool { return !want[id] })
}

// ensureLocked makes the catalog hold spec as worker id, unless the id or
// the endpoint belongs to a worker discovery did not create.
func (d *discoverer) ensureLocked(w *nameWatch, id uint64, spec *workerSpec, holders map[string]uint64) {
	l := d.ledger
	o := l.owned[id]
	rec, exists := d.catalog.Worker(id)
	if o != nil && exists && recordEndpoint(&rec) != o.spec.endpoint() {
		// Registered again through the API as another server: no longer
		// discovery's.
		delete(l.owned, id)
		o = nil
	}
	switch holder, held := holders[spec.endpoint()]; {
	case o != nil && o.name != w.key:
		d.skip(w, id, spec, "taken", "a worker of another discovered name has the id this server would get")
		return
	case o == nil && exists:
		d.skip(w, id, spec, "taken", "a worker discovery did not create has the id this server would get")
		return
	case held && holder != id:
		if o != nil && exists && l.owned[holder] == nil {
			// Made while the endpoint was free; a declared or registered
			// worker has it now.
			d.removeLocked(id, o, "a worker discovery did not create has its endpoint")
		}
		d.skip(w, id, spec, "taken", "another worker has this server's endpoint")
		return
	}
	if o != nil {
		o.misses = 0
		if exists && o.spec == *spec {
			delete(w.warned, id)
			return
		}
	}
	if _, err := d.catalog.UpsertWorker(spec.request(id, d.blockSize)); err != nil {
		if !exists {
			delete(l.owned, id)
		}
		d.skip(w, id, spec, "refused", "the catalog refused a discovered worker: "+err.Error())
		return
	}
	change, addedBy := "added", d.gen
	if exists {
		change, addedBy = "updated", o.addedBy
	}
	l.owned[id] = &ownedWorker{name: w.key, spec: *spec, addedBy: addedBy}
	delete(w.warned, id)
	discoveryChanges.WithLabelValues(w.key, change).Inc()
	d.log.Info("discovered worker "+change, zap.String("name", w.name), zap.Uint64("worker_id", id),
		zap.String("endpoint", spec.endpoint()), zap.Uint16("kv_events_port", spec.eventsPort),
		zap.Uint16("replay_port", spec.replayPort))
}

// skip counts a server that did not become a worker and logs why, once
// while the reason lasts.
func (d *discoverer) skip(w *nameWatch, id uint64, spec *workerSpec, reason, msg string) {
	discoverySkipped.WithLabelValues(w.key, reason).Inc()
	if w.warned[id] == msg {
		return
	}
	w.warned[id] = msg
	d.log.Warn(msg, zap.String("name", w.name), zap.Uint64("worker_id", id), zap.String("endpoint", spec.endpoint()))
}

// removeLocked is the ledger's removeLocked in d's catalog.
func (d *discoverer) removeLocked(id uint64, o *ownedWorker, why string) {
	d.ledger.removeLocked(d.catalog, d.log, id, o, why)
}

// removeLocked forgets an owned worker and deletes it from catalog,
// unless it is gone already or was registered again as another server.
// Under mu.
func (l *discoveryLedger) removeLocked(catalog *selection.Catalog, log *zap.Logger, id uint64, o *ownedWorker, why string) {
	delete(l.owned, id)
	rec, exists := catalog.Worker(id)
	if !exists || recordEndpoint(&rec) != o.spec.endpoint() {
		return
	}
	if _, err := catalog.DeleteWorker(id); err != nil {
		return // deleted meanwhile through the API
	}
	discoveryChanges.WithLabelValues(o.name, "removed").Inc()
	log.Info("discovered worker removed", zap.String("name", o.name), zap.Uint64("worker_id", id),
		zap.String("endpoint", o.spec.endpoint()), zap.String("reason", why))
}

// sweepLocked deletes the workers of names this config does not follow.
func (d *discoverer) sweepLocked() {
	follows := map[string]bool{}
	for _, w := range d.watches {
		follows[w.key] = true
	}
	for _, id := range slices.Sorted(maps.Keys(d.ledger.owned)) {
		if o := d.ledger.owned[id]; !follows[o.name] {
			d.removeLocked(id, o, "the config no longer follows its name")
		}
	}
	maps.DeleteFunc(d.ledger.names, func(name string, _ *nameMemory) bool { return !follows[name] })
}

// recordEndpoint is a record's endpoint as host:port (canonicalEndpoint),
// or "".
func recordEndpoint(rec *selection.WorkerRecord) string {
	if rec.Endpoint == nil {
		return ""
	}
	return canonicalEndpoint(*rec.Endpoint)
}

// canonicalEndpoint is an endpoint as host:port, an IP address written as
// discovery writes it (IPv6 compressed and lower-case): a worker declared
// at [FD00:0::5]:8000 is the one discovery finds at [fd00::5]:8000. A
// host name stays as written; it is not resolved to be matched.
func canonicalEndpoint(endpoint string) string {
	hp := selection.HostPort(strings.TrimSpace(endpoint))
	if ap, err := netip.ParseAddrPort(hp); err == nil {
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String()
	}
	return hp
}

// failed counts a resolution that had no answer; the workers stay as they
// are. The first failure in a row is a warning.
func (w *nameWatch) failed(log *zap.Logger, err error, held int) {
	discoveryResolutions.WithLabelValues(w.key, "failed").Inc()
	if w.failing {
		log.Debug("DNS discovery: the name still cannot be resolved", zap.String("name", w.name), zap.Error(err))
		return
	}
	w.failing = true
	log.Warn("DNS discovery: the name cannot be resolved; its workers stay as they are",
		zap.String("name", w.name), zap.Error(err), zap.Int("workers", held))
}

// answered counts an answer and logs what changed in how the name
// answers: resolving again, no records, more servers than max_workers.
func (w *nameWatch) answered(log *zap.Logger, ans *answer) {
	outcome := "ok"
	if ans.empty {
		outcome = "empty"
	}
	discoveryResolutions.WithLabelValues(w.key, outcome).Inc()
	if w.failing {
		w.failing = false
		log.Info("DNS discovery: the name resolves again", zap.String("name", w.name))
	}
	if ans.empty && !w.emptied {
		log.Info("DNS discovery: the name has no records; its workers leave", zap.String("name", w.name))
	}
	w.emptied = ans.empty
	if ans.dropped > 0 {
		discoverySkipped.WithLabelValues(w.key, "over_max_workers").Add(float64(ans.dropped))
		if !w.over {
			log.Warn("DNS discovery: the name has more servers than its max_workers; the rest are left out",
				zap.String("name", w.name), zap.Int("max_workers", w.maxWorkers), zap.Int("left_out", ans.dropped))
		}
	}
	w.over = ans.dropped > 0
	if ans.unusable > 0 {
		discoverySkipped.WithLabelValues(w.key, "address").Add(float64(ans.unusable))
		if !w.unusable {
			log.Warn("DNS discovery: the name's answer has addresses no worker can have (unspecified, link-local, multicast, broadcast or reserved); they are left out",
				zap.String("name", w.name), zap.Int("left_out", ans.unusable))
		}
	}
	w.unusable = ans.unusable > 0
	if n := len(ans.failedTargets); n > 0 {
		discoverySkipped.WithLabelValues(w.key, "target_failed").Add(float64(n))
		if !w.targetsFailing {
			log.Warn("DNS discovery: SRV targets could not be looked up; their workers stay as they are",
				zap.String("name", w.name), zap.Int("targets", n))
		}
	}
	w.targetsFailing = len(ans.failedTargets) > 0
}
