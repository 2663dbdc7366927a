package caddymodule

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/miekg/dns"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// The discoverer against a DNS server started by the test (testDNS), in a
// router of its own. The tests drive the refreshes themselves
// (refreshAll), so that what one refresh does is checked without timing;
// TestDiscoveryStopsWithItsLookupInFlight runs the goroutines.

// discoveryRouter is a router in approximate mode with a default block
// size, so that a discovered worker is schedulable as soon as it is added.
func discoveryRouter(t *testing.T, opts ...selection.Option) *selection.Router {
	t.Helper()
	cfg := selection.DefaultConfig()
	cfg.UseKVEvents = false
	cfg.DefaultBlockSize = 16
	r, err := selection.NewRouter(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// joinDiscovery joins a discoverer for entries, each asking srv, with
// its goroutines not started; it stops with the test.
func joinDiscovery(t *testing.T, r *selection.Router, srv *testDNS, log *zap.Logger, entries ...DNSDiscovery) *discoverer {
	t.Helper()
	for i := range entries {
		entries[i].Resolver = srv.addr
	}
	cfg := &DiscoveryConfig{Discover: entries}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	if log == nil {
		log = zap.NewNop()
	}
	d := cfg.join(r.Catalog(), 0, log)
	t.Cleanup(d.stop)
	return d
}

// refreshAll resolves every name once and applies the answers.
func (d *discoverer) refreshAll() {
	for _, w := range d.watches {
		d.refresh(d.ctx, w)
	}
}

// workersByEndpoint is the catalog by endpoint.
func workersByEndpoint(r *selection.Router) map[string]selection.WorkerRecord {
	out := map[string]selection.WorkerRecord{}
	for _, rec := range r.Catalog().ListWorkers("", "") {
		out[recordEndpoint(&rec)] = rec
	}
	return out
}

// wantEndpoints fails unless the catalog's endpoints are want.
func wantEndpoints(t *testing.T, r *selection.Router, step string, want ...string) {
	t.Helper()
	got := slices.Sorted(maps.Keys(workersByEndpoint(r)))
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("%s: workers at %v, want %v", step, got, want)
	}
}

// strp is the value of an optional string, "<nil>" when absent.
func strp(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

// TestDiscoveryFollowsARecords: each A record becomes a worker on vLLM's
// ports, with a stable id; a new record joins at the next refresh, one
// that went away leaves at the second answer without it (one answer
// without it is not enough, and a record back in time keeps its worker).
func TestDiscoveryFollowsARecords(t *testing.T) {
	srv := startTestDNS(t)
	r := discoveryRouter(t)
	const name = "pool.a.kvrouter.test."
	key := canonicalName(name)
	added0, removed0 := testCounter(discoveryChanges.WithLabelValues(key, "added")), testCounter(discoveryChanges.WithLabelValues(key, "removed"))
	srv.setA(name, "10.1.0.1", "10.1.0.2")
	d := joinDiscovery(t, r, srv, nil, DNSDiscovery{DNS: name})
	d.refreshAll()
	wantEndpoints(t, r, "first answer", "10.1.0.1:8000", "10.1.0.2:8000")
	rec := workersByEndpoint(r)["10.1.0.1:8000"]
	if rec.WorkerID != discoveredID(name, "10.1.0.1:8000") || strp(rec.KVEventsEndpoint) != "tcp://10.1.0.1:5557" ||
		strp(rec.ReplayEndpoint) != "tcp://10.1.0.1:5657" || rec.ModelName != "default" || rec.DataParallelSize != 1 ||
		!rec.Schedulable() {
		t.Fatalf("discovered worker: %+v (events %s, replay %s)", rec, strp(rec.KVEventsEndpoint), strp(rec.ReplayEndpoint))
	}
	ids := map[string]uint64{}
	for ep, rec := range workersByEndpoint(r) {
		ids[ep] = rec.WorkerID
	}

	srv.setA(name, "10.1.0.1", "10.1.0.2", "10.1.0.3")
	d.refreshAll()
	wantEndpoints(t, r, "a record added", "10.1.0.1:8000", "10.1.0.2:8000", "10.1.0.3:8000")
	for ep, rec := range workersByEndpoint(r) {
		if id, ok := ids[ep]; ok && id != rec.WorkerID {
			t.Errorf("%s: id %d after a refresh, %d before", ep, rec.WorkerID, id)
		}
	}

	srv.setA(name, "10.1.0.1", "10.1.0.3")
	d.refreshAll()
	wantEndpoints(t, r, "one answer without 10.1.0.2", "10.1.0.1:8000", "10.1.0.2:8000", "10.1.0.3:8000")
	d.refreshAll()
	wantEndpoints(t, r, "two answers without 10.1.0.2", "10.1.0.1:8000", "10.1.0.3:8000")

	srv.setA(name, "10.1.0.3")
	d.refreshAll() // 10.1.0.1 missed once
	srv.setA(name, "10.1.0.1", "10.1.0.3")
	d.refreshAll() // back: its misses start again
	srv.setA(name, "10.1.0.3")
	d.refreshAll()
	wantEndpoints(t, r, "missed once, back, missed once", "10.1.0.1:8000", "10.1.0.3:8000")

	if a, rm := testCounter(discoveryChanges.WithLabelValues(key, "added"))-added0,
		testCounter(discoveryChanges.WithLabelValues(key, "removed"))-removed0; a != 3 || rm != 1 {
		t.Errorf("changes counted: %v added, %v removed; want 3 and 1", a, rm)
	}
	if n := discoveredCounts()[key]; n != 2 {
		t.Errorf("kvrouter_discovered_workers{name=%q} = %d, want 2", key, n)
	}
	d.stop()
	if n, ok := discoveredCounts()[key]; ok {
		t.Errorf("kvrouter_discovered_workers{name=%q} = %d with no config running, want no series", key, n)
	}
}

// TestDiscoveryFollowsSRVRecords: each SRV record is a worker at its
// target's address and its port; the sibling names of the Service's other
// ports give the KV-event and replay ports, matched by target; a target
// without an address is no worker; without sibling names, the port
// settings apply.
func TestDiscoveryFollowsSRVRecords(t *testing.T) {
	srv := startTestDNS(t)
	r := discoveryRouter(t)
	const zone = "vllm.srv.kvrouter.test."
	srv.setSRV("_http._tcp."+zone, srvTo{"pod-a." + zone, 8001}, srvTo{"pod-b." + zone, 8002}, srvTo{"pod-gone." + zone, 8003})
	srv.setSRV("_kv-events._tcp."+zone, srvTo{"pod-a." + zone, 6001}, srvTo{"pod-b." + zone, 6002})
	srv.setSRV("_kv-replay._tcp."+zone, srvTo{"pod-a." + zone, 7001})
	srv.setA("pod-a."+zone, "10.2.0.1")
	srv.setA("pod-b."+zone, "10.2.0.2")
	d := joinDiscovery(t, r, srv, nil,
		DNSDiscovery{DNS: "_http._tcp." + zone, KVEventsSRV: "kv-events", ReplaySRV: "kv-replay", ModelName: "llama"})
	d.refreshAll()
	wantEndpoints(t, r, "SRV with sibling names", "10.2.0.1:8001", "10.2.0.2:8002")
	got := workersByEndpoint(r)
	a, b := got["10.2.0.1:8001"], got["10.2.0.2:8002"]
	if strp(a.KVEventsEndpoint) != "tcp://10.2.0.1:6001" || strp(a.ReplayEndpoint) != "tcp://10.2.0.1:7001" || a.ModelName != "llama" {
		t.Errorf("pod-a: %+v (events %s, replay %s)", a, strp(a.KVEventsEndpoint), strp(a.ReplayEndpoint))
	}
	if strp(b.KVEventsEndpoint) != "tcp://10.2.0.2:6002" || b.ReplayEndpoint != nil {
		t.Errorf("pod-b (no replay record): events %s, replay %s", strp(b.KVEventsEndpoint), strp(b.ReplayEndpoint))
	}
	if a.WorkerID != discoveredID("_http._tcp."+zone, "10.2.0.1:8001") {
		t.Errorf("pod-a's id %d", a.WorkerID)
	}

	// One answer without the sibling name (NXDOMAIN) keeps each target's
	// event port; the second drops it. One NXDOMAIN left every worker
	// without its event endpoint at once: incomplete, with 503s until the
	// next refresh.
	srv.set(dnsKey{fqdn("_kv-events._tcp." + zone), dns.TypeSRV}, nil)
	d.refreshAll()
	if ep := strp(workersByEndpoint(r)["10.2.0.1:8001"].KVEventsEndpoint); ep != "tcp://10.2.0.1:6001" {
		t.Errorf("one answer without the sibling: events %q, want kept", ep)
	}
	d.refreshAll()
	if ep := strp(workersByEndpoint(r)["10.2.0.1:8001"].KVEventsEndpoint); ep != "<nil>" {
		t.Errorf("two answers without the sibling: events %q, want none", ep)
	}
	srv.setSRV("_kv-events._tcp."+zone, srvTo{"pod-a." + zone, 6001}, srvTo{"pod-b." + zone, 6002})
	d.refreshAll()
	if ep := strp(workersByEndpoint(r)["10.2.0.1:8001"].KVEventsEndpoint); ep != "tcp://10.2.0.1:6001" {
		t.Errorf("the sibling back: events %q", ep)
	}

	// The type inferred from the leading underscore; the ports from the
	// settings.
	r2 := discoveryRouter(t)
	d2 := joinDiscovery(t, r2, srv, nil, DNSDiscovery{DNS: "_http._tcp." + zone, ReplayPort: new(0)})
	d2.refreshAll()
	rec := workersByEndpoint(r2)["10.2.0.1:8001"]
	if strp(rec.KVEventsEndpoint) != "tcp://10.2.0.1:5557" || rec.ReplayEndpoint != nil {
		t.Errorf("port settings: events %s, replay %s", strp(rec.KVEventsEndpoint), strp(rec.ReplayEndpoint))
	}
}

// TestDiscoveryResolverFailureKeepsWorkers: a resolver that fails keeps
// the workers as they are, however many refreshes it lasts, with one
// warning and a count per refresh; a name without records (NXDOMAIN) is
// an answer, and its workers leave.
func TestDiscoveryResolverFailureKeepsWorkers(t *testing.T) {
	srv := startTestDNS(t)
	r := discoveryRouter(t)
	core, logs := observer.New(zap.WarnLevel)
	const name = "pool.fail.kvrouter.test."
	key := canonicalName(name)
	failed0, empty0 := testCounter(discoveryResolutions.WithLabelValues(key, "failed")), testCounter(discoveryResolutions.WithLabelValues(key, "empty"))
	srv.setA(name, "10.3.0.1", "10.3.0.2")
	d := joinDiscovery(t, r, srv, zap.New(core), DNSDiscovery{DNS: name})
	d.refreshAll()
	wantEndpoints(t, r, "answered", "10.3.0.1:8000", "10.3.0.2:8000")

	srv.failWith(dns.RcodeServerFailure)
	for range 3 {
		d.refreshAll()
	}
	wantEndpoints(t, r, "three failed resolutions", "10.3.0.1:8000", "10.3.0.2:8000")
	if n := testCounter(discoveryResolutions.WithLabelValues(key, "failed")) - failed0; n != 3 {
		t.Errorf("failed resolutions counted: %v, want 3", n)
	}
	if n := logs.FilterMessageSnippet("cannot be resolved").Len(); n != 1 {
		t.Errorf("%d warnings for the failures, want 1: %v", n, logs.All())
	}

	// Without records now and then (a resolver answering NXDOMAIN half
	// the time): the workers stay. Counted in answers, two in a row
	// dropped the fleet.
	srv.failWith(0)
	clock := time.Unix(1000, 0)
	d.now = func() time.Time { return clock }
	for range 4 {
		srv.setA(name)
		d.refreshAll()
		d.refreshAll()
		wantEndpoints(t, r, "two answers in a row without records", "10.3.0.1:8000", "10.3.0.2:8000")
		clock = clock.Add(20 * time.Second)
		srv.setA(name, "10.3.0.1", "10.3.0.2")
		d.refreshAll()
	}
	wantEndpoints(t, r, "answers without records now and then", "10.3.0.1:8000", "10.3.0.2:8000")
	// Without records for emptyGrace: then the workers leave as a record
	// that went away does, at the second answer.
	srv.setA(name)
	d.refreshAll()
	clock = clock.Add(emptyGrace)
	d.refreshAll()
	wantEndpoints(t, r, "one answer without records past the grace", "10.3.0.1:8000", "10.3.0.2:8000")
	d.refreshAll()
	wantEndpoints(t, r, "two answers without records past the grace")
	if n := testCounter(discoveryResolutions.WithLabelValues(key, "empty")) - empty0; n != 11 {
		t.Errorf("empty answers counted: %v, want 11", n)
	}
}

// TestDiscoveryMaxWorkers: past max_workers, the lowest addresses are
// kept, the rest counted and warned about once; the workers a name holds
// stay when a lower address appears.
func TestDiscoveryMaxWorkers(t *testing.T) {
	srv := startTestDNS(t)
	r := discoveryRouter(t)
	core, logs := observer.New(zap.WarnLevel)
	const name = "pool.bound.kvrouter.test."
	key := canonicalName(name)
	over0 := testCounter(discoverySkipped.WithLabelValues(key, "over_max_workers"))
	var ips []string
	for i := 1; i <= 8; i++ {
		ips = append(ips, fmt.Sprintf("10.4.0.%d", i))
	}
	srv.setA(name, ips...)
	d := joinDiscovery(t, r, srv, zap.New(core), DNSDiscovery{DNS: name, MaxWorkers: 3})
	d.refreshAll()
	d.refreshAll()
	wantEndpoints(t, r, "8 records, max_workers 3", "10.4.0.1:8000", "10.4.0.2:8000", "10.4.0.3:8000")
	if n := testCounter(discoverySkipped.WithLabelValues(key, "over_max_workers")) - over0; n != 10 {
		t.Errorf("left out: %v over two refreshes, want 10", n)
	}
	if n := logs.FilterMessageSnippet("more servers than its max_workers").Len(); n != 1 {
		t.Errorf("%d warnings, want 1", n)
	}
	srv.setA(name, append([]string{"10.4.0.0"}, ips...)...)
	d.refreshAll()
	wantEndpoints(t, r, "a lower address appeared", "10.4.0.1:8000", "10.4.0.2:8000", "10.4.0.3:8000")
}

// TestDiscoveryMaxWorkersCountsTheLeaving: the workers an answer has just
// lost stay for another answer, and count against max_workers meanwhile.
// A name whose every answer was a new set of max_workers servers held
// twice max_workers (512 at the default), with their listeners.
func TestDiscoveryMaxWorkersCountsTheLeaving(t *testing.T) {
	srv := startTestDNS(t)
	r := discoveryRouter(t)
	const name = "pool.flap.kvrouter.test."
	set := func(third int) []string {
		return []string{fmt.Sprintf("10.6.%d.1", third), fmt.Sprintf("10.6.%d.2", third), fmt.Sprintf("10.6.%d.3", third)}
	}
	srv.setA(name, set(0)...)
	d := joinDiscovery(t, r, srv, nil, DNSDiscovery{DNS: name, MaxWorkers: 3})
	d.refreshAll()
	wantEndpoints(t, r, "the first set", "10.6.0.1:8000", "10.6.0.2:8000", "10.6.0.3:8000")
	for i := 1; i <= 6; i++ {
		srv.setA(name, set(i)...)
		d.refreshAll()
		// Those that leave go first: left for after the adds, the name
		// held no worker one answer in three.
		if n := len(r.Catalog().ListWorkers("", "")); n != 3 {
			t.Fatalf("answer %d, a new set of 3: %d workers held, want 3", i, n)
		}
	}
	srv.setA(name, set(7)...)
	d.refreshAll()
	d.refreshAll()
	d.refreshAll()
	wantEndpoints(t, r, "a set that stays", "10.6.7.1:8000", "10.6.7.2:8000", "10.6.7.3:8000")
}

// TestDiscoveryGracesOutliveAReload: a name's grace without records is
// the ledger's, so a new config carries it on. Each config's own, a
// reload every 20 s kept a name without records at its workers for good.
func TestDiscoveryGracesOutliveAReload(t *testing.T) {
	srv := startTestDNS(t)
	r := discoveryRouter(t)
	const name = "pool.reload.kvrouter.test."
	srv.setA(name, "10.9.0.1")
	old := joinDiscovery(t, r, srv, nil, DNSDiscovery{DNS: name})
	old.refreshAll()
	srv.setA(name)
	clock := time.Unix(1000, 0)
	old.now = func() time.Time { return clock }
	old.refreshAll() // no records since 1000
	next := joinDiscovery(t, r, srv, nil, DNSDiscovery{DNS: name, Refresh: caddy.Duration(2 * time.Second)})
	next.now = func() time.Time { return clock.Add(emptyGrace) }
	next.refreshAll()
	next.refreshAll()
	wantEndpoints(t, r, "no records for the grace, across a reload")
}

// TestDiscoveryKeepsAFailedTargetsWorkers: an SRV target whose lookup
// fails keeps its workers, and the rest of the answer applies. One
// failing target failed the whole resolution: 20 targets failing 10 % of
// the time left 27 of 30 resolutions failed, and one failing for good
// froze the name.
func TestDiscoveryKeepsAFailedTargetsWorkers(t *testing.T) {
	srv := startTestDNS(t)
	r := discoveryRouter(t)
	const zone = "vllm.failing.kvrouter.test."
	srv.setSRV("_http._tcp."+zone, srvTo{"pod-a." + zone, 8001}, srvTo{"pod-b." + zone, 8002})
	srv.setA("pod-a."+zone, "10.10.0.1")
	srv.setA("pod-b."+zone, "10.10.0.2")
	d := joinDiscovery(t, r, srv, nil, DNSDiscovery{DNS: "_http._tcp." + zone})
	d.refreshAll()
	wantEndpoints(t, r, "both targets", "10.10.0.1:8001", "10.10.0.2:8002")
	srv.failName("pod-a."+zone, dns.RcodeServerFailure)
	srv.setSRV("_http._tcp."+zone, srvTo{"pod-a." + zone, 8001}, srvTo{"pod-c." + zone, 8003})
	srv.setA("pod-c."+zone, "10.10.0.3")
	d.refreshAll()
	d.refreshAll()
	wantEndpoints(t, r, "pod-a failing, pod-b gone, pod-c new", "10.10.0.1:8001", "10.10.0.3:8003")
	// Every target left failing: those gone from the answer still go.
	key := canonicalName("_http._tcp." + zone)
	failed0 := testCounter(discoverySkipped.WithLabelValues(key, "target_failed"))
	srv.setSRV("_http._tcp."+zone, srvTo{"pod-a." + zone, 8001})
	d.refreshAll()
	d.refreshAll()
	wantEndpoints(t, r, "pod-a failing alone, pod-c gone", "10.10.0.1:8001")
	if n := testCounter(discoverySkipped.WithLabelValues(key, "target_failed")) - failed0; n != 2 {
		t.Errorf("failed targets counted: %v, want 2", n)
	}
}

// TestDiscoveryLeavesOutUnusableAddresses: unspecified, link-local,
// multicast, broadcast and reserved addresses are no worker's (a cloud's
// metadata service at 169.254.169.254 was read and proxied to); they are
// counted and warned about once.
func TestDiscoveryLeavesOutUnusableAddresses(t *testing.T) {
	srv := startTestDNS(t)
	r := discoveryRouter(t)
	core, logs := observer.New(zap.WarnLevel)
	const name = "pool.odd.kvrouter.test."
	key := canonicalName(name)
	skipped0 := testCounter(discoverySkipped.WithLabelValues(key, "address"))
	srv.setA(name, "0.0.0.0", "169.254.169.254", "224.0.0.1", "255.255.255.255", "240.0.0.1", "10.7.0.1", "127.0.0.9")
	d := joinDiscovery(t, r, srv, zap.New(core), DNSDiscovery{DNS: name})
	d.refreshAll()
	d.refreshAll()
	wantEndpoints(t, r, "usable addresses only", "10.7.0.1:8000", "127.0.0.9:8000")
	if n := testCounter(discoverySkipped.WithLabelValues(key, "address")) - skipped0; n != 10 {
		t.Errorf("left out: %v over two refreshes, want 10", n)
	}
	if n := logs.FilterMessageSnippet("addresses no worker can have").Len(); n != 1 {
		t.Errorf("%d warnings, want 1", n)
	}
	for _, ip := range []string{"fe80::1", "ff02::1", "::"} {
		if usableAddr(netip.MustParseAddr(ip)) {
			t.Errorf("%s taken as a worker's address", ip)
		}
	}
}

// slowRefresh is a refresh of name's 20 workers (10.8.<net>.x) held in
// its first write: every endpoint check waits for release. checks counts
// them; refreshed closes when the refresh ends.
type slowRefresh struct {
	srv       *testDNS
	r         *selection.Router
	d         *discoverer
	checks    *atomic.Int32
	release   chan struct{}
	refreshed chan struct{}
}

func startSlowRefresh(t *testing.T, name string, net int) *slowRefresh {
	t.Helper()
	s := &slowRefresh{srv: startTestDNS(t), checks: new(atomic.Int32), release: make(chan struct{}), refreshed: make(chan struct{})}
	entered := make(chan struct{})
	s.r = discoveryRouter(t, selection.WithEndpointCheck(func(string) error {
		if s.checks.Add(1) == 1 {
			close(entered)
		}
		<-s.release
		return nil
	}))
	var ips []string
	for i := 1; i <= 20; i++ {
		ips = append(ips, fmt.Sprintf("10.8.%d.%d", net, i))
	}
	s.srv.setA(name, ips...)
	s.d = joinDiscovery(t, s.r, s.srv, nil, DNSDiscovery{DNS: name})
	go func() { s.d.refreshAll(); close(s.refreshed) }()
	<-entered // the refresh is in its first write
	return s
}

// TestDiscoveryRefreshGivesWayToAReload: a refresh's catalog writes stop
// for a config that is starting. Each write may probe its endpoint (the
// catalog's check that it is not the gateway), two seconds for one that
// accepts and never answers: a reload waited 38 s behind a refresh
// writing 20 such workers, all under the ledger's lock.
func TestDiscoveryRefreshGivesWayToAReload(t *testing.T) {
	const name = "pool.slow.kvrouter.test."
	sr := startSlowRefresh(t, name, 0)
	srv, r, old, checks, release, refreshed := sr.srv, sr.r, sr.d, sr.checks, sr.release, sr.refreshed
	joined := make(chan struct{})
	go func() { joinDiscovery(t, r, srv, nil, DNSDiscovery{DNS: name}); close(joined) }()
	for old.ledger.joining.Load() == 0 {
		time.Sleep(time.Millisecond) // the new config waits for the ledger
	}
	close(release)
	<-joined
	<-refreshed
	if n := checks.Load(); n != 1 {
		t.Fatalf("the refresh wrote %d workers, checks and all, before the new config could start; want 1", n)
	}
}

// TestDiscoveryRefreshGivesWayToDeclarations: a reload's declared
// workers make discovery's give way (syncWorkers), under the ledger's
// lock; a refresh under way stops at its next write for them, as for a
// joining config, where the reload waited for its every write.
func TestDiscoveryRefreshGivesWayToDeclarations(t *testing.T) {
	sr := startSlowRefresh(t, "pool.declared.kvrouter.test.", 1)
	r, d, checks, release, refreshed := sr.r, sr.d, sr.checks, sr.release, sr.refreshed
	synced := make(chan error, 1)
	go func() {
		id, ep, bs := uint64(1), "10.8.2.1:8000", uint32(16)
		state := &routerState{router: r, fromConfig: map[uint64]struct{}{}}
		_, err := state.syncWorkers([]*selection.WorkerRequest{{WorkerID: &id, Endpoint: &ep, BlockSize: &bs}}, zap.NewNop())
		synced <- err
	}()
	for start := time.Now(); d.ledger.joining.Load() == 0 && time.Since(start) < 2*time.Second; {
		time.Sleep(time.Millisecond) // the declarations wait for the ledger
	}
	close(release)
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	<-refreshed
	if n := checks.Load(); n != 2 {
		t.Fatalf("%d endpoint checks: the refresh wrote its workers before the declarations could be applied; want 2 (its first, the declared one)", n)
	}
}

// TestRefusedDeclarationGivesTheEndpointBack: a declaration the catalog
// refuses after discovery's worker at its endpoint gave way has the name
// resolved at once, and the worker comes back, where the engine waited a
// refresh (an hour here) without one.
func TestRefusedDeclarationGivesTheEndpointBack(t *testing.T) {
	srv := startTestDNS(t)
	r := discoveryRouter(t)
	const n = "refused.kvrouter.test."
	srv.setA(n, "10.8.3.1")
	cfg := &DiscoveryConfig{Discover: []DNSDiscovery{{DNS: n, Resolver: srv.addr, Refresh: caddy.Duration(time.Hour)}}}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	d := cfg.start(r.Catalog(), 0, zap.NewNop())
	t.Cleanup(d.stop)
	waitFor := func(step string, want int) {
		t.Helper()
		for start := time.Now(); len(r.Catalog().ListWorkers("", "")) != want; time.Sleep(10 * time.Millisecond) {
			if time.Since(start) > 5*time.Second {
				t.Fatalf("%s: %d workers, want %d", step, len(r.Catalog().ListWorkers("", "")), want)
			}
		}
	}
	waitFor("discovered", 1)
	id, ep, bs, tooLong := uint64(1), "10.8.3.1:8000", uint32(16), uint64(1)<<40
	state := &routerState{router: r, fromConfig: map[uint64]struct{}{}}
	_, err := state.syncWorkers([]*selection.WorkerRequest{{WorkerID: &id, Endpoint: &ep, BlockSize: &bs, MaxModelLen: &tooLong}}, zap.NewNop())
	if err == nil {
		t.Fatal("a declaration past the bounds was applied")
	}
	waitFor("after the refused declaration", 1)
}

// TestCanonicalEndpoint: an endpoint as discovery writes it.
func TestCanonicalEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.1:8000": "10.0.0.1:8000", "http://10.0.0.1:8000/": "10.0.0.1:8000", " 10.0.0.1:8000": "10.0.0.1:8000",
		"[FD00:0::5]:8000": "[fd00::5]:8000", "[::ffff:10.0.0.1]:8000": "10.0.0.1:8000", "worker-0:8000": "worker-0:8000",
	} {
		if got := canonicalEndpoint(in); got != want {
			t.Errorf("canonicalEndpoint(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestDiscoveryBoundsAHostileAnswer: an answer of 2,000 addresses (over
// TCP, as the UDP answer is truncated) becomes max_workers' default of
// 256 workers.
func TestDiscoveryBoundsAHostileAnswer(t *testing.T) {
	srv := startTestDNS(t)
	r := discoveryRouter(t)
	const name = "pool.hostile.kvrouter.test."
	key := canonicalName(name)
	over0 := testCounter(discoverySkipped.WithLabelValues(key, "over_max_workers"))
	var ips []string
	for i := range 2000 {
		ips = append(ips, fmt.Sprintf("10.5.%d.%d", i/250, i%250+1))
	}
	srv.setA(name, ips...)
	d := joinDiscovery(t, r, srv, nil, DNSDiscovery{DNS: name})
	start := time.Now()
	d.refreshAll()
	took := time.Since(start)
	if n := len(r.Catalog().ListWorkers("", "")); n != defaultDiscoveryMaxWorkers {
		t.Fatalf("%d workers, want %d", n, defaultDiscoveryMaxWorkers)
	}
	if n := testCounter(discoverySkipped.WithLabelValues(key, "over_max_workers")) - over0; n != 2000-defaultDiscoveryMaxWorkers {
		t.Errorf("left out: %v", n)
	}
	t.Logf("2,000 addresses resolved and 256 workers added in %v", took.Round(time.Millisecond))
}

// TestDiscoveryLeavesOtherWorkersAlone: a server whose endpoint a worker
// registered by hand has is not discovered again; workers registered by
// hand are neither updated nor deleted; a discovered id registered again
// through the API as another server is no longer discovery's.
func TestDiscoveryLeavesOtherWorkersAlone(t *testing.T) {
	srv := startTestDNS(t)
	r := discoveryRouter(t)
	const name = "pool.others.kvrouter.test."
	key := canonicalName(name)
	taken0 := testCounter(discoverySkipped.WithLabelValues(key, "taken"))
	for id, ep := range map[uint64]string{7: "10.6.0.1:8000", 8: "10.6.0.9:8000"} {
		if _, err := r.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: &id, Endpoint: &ep}); err != nil {
			t.Fatal(err)
		}
	}
	srv.setA(name, "10.6.0.1", "10.6.0.2", "10.6.0.3")
	d := joinDiscovery(t, r, srv, nil, DNSDiscovery{DNS: name})
	d.refreshAll()
	got := workersByEndpoint(r)
	if len(got) != 4 || got["10.6.0.1:8000"].WorkerID != 7 || got["10.6.0.2:8000"].WorkerID < discoveredIDBit {
		t.Fatalf("workers: %v", slices.Collect(maps.Keys(got)))
	}
	if n := testCounter(discoverySkipped.WithLabelValues(key, "taken")) - taken0; n != 1 {
		t.Errorf("taken: %v, want 1", n)
	}

	// 10.6.0.3's id registered again through the API, as another server.
	id3, other := got["10.6.0.3:8000"].WorkerID, "10.6.0.99:8000"
	if _, err := r.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: &id3, Endpoint: &other}); err != nil {
		t.Fatal(err)
	}
	srv.setA(name)
	d.refreshAll()
	clock := time.Now().Add(emptyGrace)
	d.now = func() time.Time { return clock }
	d.refreshAll()
	d.refreshAll()
	wantEndpoints(t, r, "every record gone", "10.6.0.1:8000", "10.6.0.9:8000", other)
}

// TestDiscoveryRefusedByTheCatalog: the catalog's endpoint check (the
// gateway's own listeners, in Caddy) refuses a server; the others are
// added, and the refusal is counted at each refresh and logged once.
func TestDiscoveryRefusedByTheCatalog(t *testing.T) {
	srv := startTestDNS(t)
	r := discoveryRouter(t, selection.WithEndpointCheck(func(ep string) error {
		if strings.HasPrefix(ep, "10.8.0.66:") {
			return errors.New("endpoint is this gateway's own listener")
		}
		return nil
	}))
	core, logs := observer.New(zap.WarnLevel)
	const name = "pool.refused.kvrouter.test."
	key := canonicalName(name)
	refused0 := testCounter(discoverySkipped.WithLabelValues(key, "refused"))
	srv.setA(name, "10.8.0.1", "10.8.0.66")
	d := joinDiscovery(t, r, srv, zap.New(core), DNSDiscovery{DNS: name})
	d.refreshAll()
	d.refreshAll()
	wantEndpoints(t, r, "one refused", "10.8.0.1:8000")
	if n := testCounter(discoverySkipped.WithLabelValues(key, "refused")) - refused0; n != 2 {
		t.Errorf("refused: %v, want 2", n)
	}
	if n := logs.FilterMessageSnippet("refused a discovered worker").Len(); n != 1 {
		t.Errorf("%d warnings, want 1", n)
	}
}

// TestDiscoveryDataParallelAndIPv6: a worker with two data-parallel ranks
// gets an event endpoint per rank on consecutive ports and no replay;
// AAAA records give IPv6 endpoints.
func TestDiscoveryDataParallelAndIPv6(t *testing.T) {
	srv := startTestDNS(t)
	r := discoveryRouter(t)
	srv.setA("pool.dp.kvrouter.test.", "10.9.0.1")
	srv.setAAAA("pool.v6.kvrouter.test.", "fd00::1")
	d := joinDiscovery(t, r, srv, nil,
		DNSDiscovery{DNS: "pool.dp.kvrouter.test.", DataParallelSize: 2, RoutingGroup: "dp"},
		DNSDiscovery{DNS: "pool.v6.kvrouter.test.", Type: "aaaa", HTTPPort: 9000})
	d.refreshAll()
	got := workersByEndpoint(r)
	dp := got["10.9.0.1:8000"]
	if dp.DataParallelSize != 2 || dp.RoutingGroup != "dp" || dp.ReplayEndpoint != nil || dp.KVEventsEndpoint != nil ||
		!maps.Equal(dp.KVEventsEndpoints, map[string]string{"0": "tcp://10.9.0.1:5557", "1": "tcp://10.9.0.1:5558"}) {
		t.Errorf("dp worker: %+v", dp)
	}
	v6 := got["[fd00::1]:9000"]
	if strp(v6.KVEventsEndpoint) != "tcp://[fd00::1]:5557" || strp(v6.ReplayEndpoint) != "tcp://[fd00::1]:5657" {
		t.Errorf("IPv6 worker: %+v", v6)
	}
}

// TestDiscoveryReloadHandsOver: the new config's discoverer writes from
// its start (the old one, still running, stops writing), updates the
// workers whose settings changed, and deletes at once those of a name it
// no longer follows; if the new config stops (a failed start), the old
// one writes again.
func TestDiscoveryReloadHandsOver(t *testing.T) {
	srv := startTestDNS(t)
	r := discoveryRouter(t)
	const x, y = "x.reload.kvrouter.test.", "y.reload.kvrouter.test."
	srv.setA(x, "10.7.0.1")
	srv.setA(y, "10.7.1.1")
	old := joinDiscovery(t, r, srv, nil, DNSDiscovery{DNS: x, ModelName: "a"}, DNSDiscovery{DNS: y})
	old.refreshAll()
	wantEndpoints(t, r, "old config", "10.7.0.1:8000", "10.7.1.1:8000")

	updated0 := testCounter(discoveryChanges.WithLabelValues(canonicalName(x), "updated"))
	next := joinDiscovery(t, r, srv, nil, DNSDiscovery{DNS: x, ModelName: "b"})
	wantEndpoints(t, r, "new config started", "10.7.0.1:8000")
	old.refreshAll()
	wantEndpoints(t, r, "the old config refreshed", "10.7.0.1:8000")
	next.refreshAll()
	if rec := workersByEndpoint(r)["10.7.0.1:8000"]; rec.ModelName != "b" || rec.WorkerID != discoveredID(x, "10.7.0.1:8000") {
		t.Errorf("after the new config's refresh: %+v", rec)
	}
	if n := testCounter(discoveryChanges.WithLabelValues(canonicalName(x), "updated")) - updated0; n != 1 {
		t.Errorf("updated: %v, want 1", n)
	}

	next.stop()
	old.refreshAll()
	wantEndpoints(t, r, "the new config stopped", "10.7.0.1:8000", "10.7.1.1:8000")
}

// TestDiscoveryFailedLoadGivesTheCatalogBack: a new config whose load
// fails after its discovery joined (it swept the names only the running
// config follows, and added its own) gives the catalog back at once: its
// names' workers go, and the running config resolves its own again,
// without waiting for its refresh (an hour here). A refused config's
// workers stayed until the next load, and got traffic.
func TestDiscoveryFailedLoadGivesTheCatalogBack(t *testing.T) {
	srv := startTestDNS(t)
	r := discoveryRouter(t)
	const x, y, z = "x.failed.kvrouter.test.", "y.failed.kvrouter.test.", "z.failed.kvrouter.test."
	srv.setA(x, "10.8.0.1")
	srv.setA(y, "10.8.1.1")
	srv.setA(z, "10.8.2.1")
	port := 8000
	hourly := func(names ...string) *DiscoveryConfig {
		cfg := &DiscoveryConfig{}
		for _, n := range names {
			cfg.Discover = append(cfg.Discover, DNSDiscovery{DNS: n, Resolver: srv.addr, Refresh: caddy.Duration(time.Hour), HTTPPort: port})
		}
		if err := cfg.validate(); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	running := hourly(x, y).start(r.Catalog(), 0, zap.NewNop())
	t.Cleanup(running.stop)
	waitEndpoints := func(step string, want ...string) {
		t.Helper()
		for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
			got := slices.Sorted(maps.Keys(workersByEndpoint(r)))
			if slices.Equal(got, want) {
				return
			}
			if time.Since(start) > 5*time.Second {
				t.Fatalf("%s: workers at %v, want %v", step, got, want)
			}
		}
	}
	waitEndpoints("the running config", "10.8.0.1:8000", "10.8.1.1:8000")
	refused := hourly(x, z).start(r.Catalog(), 0, zap.NewNop())
	waitEndpoints("the new config started", "10.8.0.1:8000", "10.8.2.1:8000")
	refused.stop() // its load failed
	waitEndpoints("after the failed load", "10.8.0.1:8000", "10.8.1.1:8000")

	// The same names on another port: the refused config's workers are
	// no other name's, and went only at the running config's next
	// refresh (an hour here).
	port = 9000
	refused = hourly(x, y).start(r.Catalog(), 0, zap.NewNop())
	waitEndpoints("a config of the same names on another port started",
		"10.8.0.1:8000", "10.8.0.1:9000", "10.8.1.1:8000", "10.8.1.1:9000")
	refused.stop()
	waitEndpoints("after its load failed", "10.8.0.1:8000", "10.8.1.1:8000")
}

// TestDiscoveryGivesWayToAWorkerOfItsEndpoint: a worker discovery made
// while its endpoint was free gives way to a worker declared or
// registered there later: the config's declarations take it at once
// (syncWorkers), a registration at the next answer. Left, both took the
// engine's traffic for good, and, the catalog full, a reload back to a
// config declaring the worker was refused.
func TestDiscoveryGivesWayToAWorkerOfItsEndpoint(t *testing.T) {
	srv := startTestDNS(t)
	r := discoveryRouter(t)
	const n = "n.way.kvrouter.test."
	srv.setA(n, "10.9.0.1", "10.9.0.2")
	d := joinDiscovery(t, r, srv, nil, DNSDiscovery{DNS: n})
	d.refreshAll()
	wantEndpoints(t, r, "discovered", "10.9.0.1:8000", "10.9.0.2:8000")

	id, ep, bs := uint64(1), "10.9.0.1:8000", uint32(16)
	state := &routerState{router: r, fromConfig: map[uint64]struct{}{}}
	if _, err := state.syncWorkers([]*selection.WorkerRequest{{WorkerID: &id, Endpoint: &ep, BlockSize: &bs}}, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	if got := workersByEndpoint(r); got[ep].WorkerID != id || len(got) != 2 {
		t.Fatalf("after the declaration: %v; want worker 1 alone at %s", got, ep)
	}
	d.refreshAll()
	if got := workersByEndpoint(r); got[ep].WorkerID != id || len(r.Catalog().ListWorkers("", "")) != 2 {
		t.Fatalf("after a refresh: %d workers; want worker 1 alone at %s", len(r.Catalog().ListWorkers("", "")), ep)
	}

	// Registered through the API at a discovered endpoint: the discovered
	// worker goes at the next answer.
	id2, ep2 := uint64(2), "10.9.0.2:8000"
	if _, err := r.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: &id2, Endpoint: &ep2, BlockSize: &bs}); err != nil {
		t.Fatal(err)
	}
	d.refreshAll()
	var ids []uint64
	for _, rec := range r.Catalog().ListWorkers("", "") {
		ids = append(ids, rec.WorkerID)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []uint64{1, 2}) {
		t.Fatalf("after a registration and a refresh: workers %v; want 1 and 2 alone", ids)
	}
}

// TestDiscoveryStopsWithItsLookupInFlight: stopping cancels a lookup that
// a silent resolver would otherwise hold for its whole timeout, and no
// goroutine is left.
func TestDiscoveryStopsWithItsLookupInFlight(t *testing.T) {
	// The config the test before left running (Caddy is the package's,
	// shared) may still have KV-event listeners redialing publishers that
	// test closed: a redial is a new goroutine, which IgnoreCurrent below
	// cannot know. A blank config stops them first.
	newTester(t)
	srv := startTestDNS(t)
	r := discoveryRouter(t)
	srv.setSilent(true)
	leaks := goleak.IgnoreCurrent()
	cfg := &DiscoveryConfig{Discover: []DNSDiscovery{
		{DNS: "a.stop.kvrouter.test.", Resolver: srv.addr},
		{DNS: "_http._tcp.stop.kvrouter.test.", Resolver: srv.addr},
	}}
	d := cfg.start(r.Catalog(), 0, zap.NewNop())
	select {
	case <-srv.asked:
	case <-time.After(5 * time.Second):
		t.Fatal("the resolver was never asked")
	}
	start := time.Now()
	d.stop()
	if took := time.Since(start); took > time.Second {
		t.Errorf("stop took %v", took)
	}
	goleak.VerifyNone(t, leaks)
	(*discoverer)(nil).stop() // what Stop does for a config that never started one
}

// TestDiscoveredIDs: ids are stable, in [2^62, 2^63), and differ per name
// and per endpoint; the name's case and trailing dot do not matter.
func TestDiscoveredIDs(t *testing.T) {
	seen := map[uint64]string{}
	for _, name := range []string{"a.example", "b.example"} {
		for i := range 1000 {
			ep := fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250)
			id := discoveredID(name, ep)
			if id < discoveredIDBit || id >= 2*discoveredIDBit {
				t.Fatalf("%s %s: id %#x out of range", name, ep, id)
			}
			if prev, dup := seen[id]; dup {
				t.Fatalf("%s %s and %s: the same id", name, ep, prev)
			}
			seen[id] = name + " " + ep
		}
	}
	if discoveredID("A.Example.", "10.0.0.1:8000") != discoveredID("a.example", "10.0.0.1:8000") {
		t.Error("the name's case or trailing dot changed the id")
	}
	// Pinned: a change of the scheme would give every discovered worker
	// of a running fleet a new id at the upgrade.
	if id := discoveredID("vllm.llm.svc.cluster.local", "10.0.0.1:8000"); id != pinnedDiscoveredID {
		t.Errorf("id %d, pinned %d", id, uint64(pinnedDiscoveredID))
	}
}

// pinnedDiscoveredID is the id of 10.0.0.1:8000 under
// vllm.llm.svc.cluster.local, as docs/discovery.md computes it.
const pinnedDiscoveredID = 5787812473995787585
