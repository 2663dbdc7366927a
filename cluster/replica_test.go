package cluster

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

func TestMain(m *testing.M) {
	// The embedded server's own: its JetStream file store flushes and its
	// shared clock outlive a Shutdown by a moment.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"))
}

func TestReplicasSeeEachOthersBookings(t *testing.T) {
	s := natsServer(t, 0)
	a, b := testRouter(t), testRouter(t)
	joinedPair(t, a, b, s.ClientURL(), nil)

	reserve(t, a, "a1", 1, []uint64{1, 2, 3}, 40)
	waitFor(t, 2*time.Second, "B sees A's booking", func() bool { return load(b, 1).ActiveRequests == 1 })
	reserve(t, b, "b1", 1, []uint64{1, 2, 9}, 10)
	waitFor(t, 2*time.Second, "both see the fleet's load", func() bool { return same(a, b) })
	if l := load(a, 1); l.ActiveRequests != 2 || l.PotentialPrefillTokens != 50 || l.PotentialDecodeBlocks != 4 {
		t.Fatalf("fleet load on worker 1: %+v", l)
	}
	if err := a.PrefillComplete("a1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "B sees A's prefill complete", func() bool { return load(b, 1).PotentialPrefillTokens == 10 })
	for _, f := range []func() error{func() error { return a.Free("a1") }, func() error { return b.Free("b1") }} {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 2*time.Second, "both back to idle", func() bool {
		return load(a, 1).ActiveRequests == 0 && load(b, 1).ActiveRequests == 0 && a.Remote().Total() == 0 && b.Remote().Total() == 0
	})
}

// TestBookingVisibleLatency measures how long a booking made on A takes to
// show in B's loads, over 200 bookings on loopback (the target is
// a p99 of 5 ms).
func TestBookingVisibleLatency(t *testing.T) {
	s := natsServer(t, 0)
	a, b := testRouter(t), testRouter(t)
	ra := startReplica(t, a, s.ClientURL(), "a", nil)
	startReplica(t, b, s.ClientURL(), "b", nil)
	waitFor(t, 5*time.Second, "A hears B", func() bool { return ra.Stats().Peers == 1 })
	var lat []time.Duration
	for i := range 200 {
		id := fmt.Sprintf("r%d", i)
		start := time.Now()
		reserve(t, a, id, 2, []uint64{uint64(i)}, 16)
		for load(b, 2).ActiveRequests != uint64(i+1) {
			if time.Since(start) > 2*time.Second {
				t.Fatalf("booking %d not visible on B", i)
			}
			time.Sleep(20 * time.Microsecond) // a spinning reader would starve B's NATS goroutines
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	t.Logf("booking on A visible in B's loads: p50 %v p99 %v max %v (200 bookings)", lat[100], lat[197], lat[199])
}

// TestSilentReplicaLeaseExpires: a replica that stops sending (as a
// killed one does) has its bookings dropped by the others at the lease of
// its last message: not before it, and not a check interval after it.
func TestSilentReplicaLeaseExpires(t *testing.T) {
	s := natsServer(t, 0)
	a, b := testRouter(t), testRouter(t)
	const lease = 2 * time.Second
	long := func(c *Config) { c.Lease = lease }
	ra := startReplica(t, a, s.ClientURL(), "a", long)
	rb := startReplica(t, b, s.ClientURL(), "b", long)
	reserve(t, a, "a1", 1, []uint64{1, 2}, 40)
	reserve(t, a, "a2", 2, []uint64{5}, 40)
	waitFor(t, 2*time.Second, "B sees A's bookings", func() bool { return b.Remote().Count("a") == 2 })
	ra.Close() // silent from now on; its bookings stay live in A's router
	var last time.Time
	lastSeen := func() (time.Time, bool) {
		rb.mu.Lock()
		defer rb.mu.Unlock()
		if p := rb.peers["a"]; p != nil {
			return p.lastSeen, true
		}
		return time.Time{}, false
	}
	for start := time.Now(); ; time.Sleep(time.Millisecond) {
		seen, ok := lastSeen()
		if !ok {
			break
		}
		last = seen
		if time.Since(start) > 2*lease {
			t.Fatal("A's bookings never expired on B")
		}
	}
	gone := time.Since(last)
	if load(b, 1).ActiveRequests != 0 || load(b, 2).ActiveRequests != 0 {
		t.Fatalf("A dropped but its load counts: %+v %+v", load(b, 1), load(b, 2))
	}
	t.Logf("bookings dropped %v after the last message (lease %v)", gone, lease)
	// Polled every millisecond: the drop is seen at most a poll (and a
	// busy machine's scheduling delay) after it happened. The check
	// interval this replaced was lease/8 = 250ms.
	if gone < lease || gone > lease+100*time.Millisecond {
		t.Fatalf("bookings dropped %v after the last message, lease %v", gone, lease)
	}
	if got := rb.Stats().LeaseExpiries; got != 1 {
		t.Fatalf("lease expiries %d", got)
	}
}

// TestPeersOwnLeaseIsKept: replicas may run other heartbeats and
// leases; each keeps a peer's bookings for the lease the peer says it
// runs. A receiver's own, shorter than the sender's heartbeat, dropped
// the sender between its heartbeats, again and again (3 expiries in 12 s
// with 1 s against 4 s).
func TestPeersOwnLeaseIsKept(t *testing.T) {
	s := natsServer(t, 0)
	a, b := testRouter(t), testRouter(t)
	ra := startReplica(t, a, s.ClientURL(), "a", nil) // heartbeat 50ms, lease 300ms
	slow := func(c *Config) { c.Heartbeat, c.Lease = 400*time.Millisecond, 1200*time.Millisecond }
	rb := startReplica(t, b, s.ClientURL(), "b", slow)
	reserve(t, b, "b1", 1, []uint64{1, 2}, 40)
	waitFor(t, 3*time.Second, "A sees B's booking", func() bool { return a.Remote().Count("b") == 1 })
	for range 15 { // 1.5 s: three of B's heartbeats, each past A's lease
		if a.Remote().Count("b") != 1 {
			t.Fatalf("A dropped B's booking between B's heartbeats (%d expiries)", ra.Stats().LeaseExpiries)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := ra.Stats().LeaseExpiries; got != 0 {
		t.Fatalf("A let B's lease run out %d times", got)
	}
	rb.Close()
	waitFor(t, 3*time.Second, "A drops B once B is silent past B's lease", func() bool { return a.Remote().Count("b") == 0 })
}

// TestOutageAndResync: with NATS gone both replicas route alone; when it is
// back they converge on each other's live bookings, including what changed
// while it was away.
func TestOutageAndResync(t *testing.T) {
	s := natsServer(t, 0)
	url := s.ClientURL()
	port, _ := strconv.Atoi(url[strings.LastIndexByte(url, ':')+1:])
	a, b := testRouter(t), testRouter(t)
	ra := startReplica(t, a, url, "a", nil)
	rb := startReplica(t, b, url, "b", nil)
	reserve(t, a, "a1", 1, []uint64{1, 2}, 40)
	reserve(t, a, "a2", 2, []uint64{7}, 30)
	waitFor(t, 2*time.Second, "B sees A's bookings", func() bool { return same(a, b) })

	s.Shutdown()
	s.WaitForShutdown()
	waitFor(t, 2*time.Second, "both route alone", func() bool {
		return !ra.Stats().Connected && !rb.Stats().Connected && b.Remote().Total() == 0
	})
	if l := load(b, 1); l.ActiveRequests != 0 {
		t.Fatalf("B, alone, still counts A's booking: %+v", l)
	}
	// While NATS is away: A frees one and books another, B books one.
	if err := a.Free("a1"); err != nil {
		t.Fatal(err)
	}
	reserve(t, a, "a3", 1, []uint64{3}, 20)
	reserve(t, b, "b1", 2, []uint64{8}, 10)

	natsServer(t, port)
	took := waitFor(t, 5*time.Second, "the replicas converge after NATS returns", func() bool {
		return same(a, b) && load(a, 1).ActiveRequests == 1 && load(a, 2).ActiveRequests == 2
	})
	t.Logf("converged %v after the server restarted", took)
	if ra.Stats().Outages != 1 || rb.Stats().Outages != 1 {
		t.Fatalf("outages counted: a %d b %d", ra.Stats().Outages, rb.Stats().Outages)
	}
}

// TestLateReplicaGetsLiveBookings: a replica that starts after bookings
// were made learns them from the others' announcement.
func TestLateReplicaGetsLiveBookings(t *testing.T) {
	s := natsServer(t, 0)
	a, b := testRouter(t), testRouter(t)
	startReplica(t, a, s.ClientURL(), "a", nil)
	reserve(t, a, "a1", 1, []uint64{1, 2}, 40)
	time.Sleep(100 * time.Millisecond)
	startReplica(t, b, s.ClientURL(), "b", nil)
	waitFor(t, 2*time.Second, "the late replica sees A's booking", func() bool { return same(a, b) && load(b, 1).ActiveRequests == 1 })
}

// TestMismatchedReplicaRefused: a replica with other routing settings (or
// another build) is refused and counted; its bookings are not applied.
func TestMismatchedReplicaRefused(t *testing.T) {
	s := natsServer(t, 0)
	a, b := testRouter(t), testRouter(t)
	startReplica(t, a, s.ClientURL(), "a", func(c *Config) { c.Fingerprint = 7 })
	rb := startReplica(t, b, s.ClientURL(), "b", nil)
	reserve(t, a, "a1", 1, []uint64{1, 2}, 40)
	waitFor(t, 2*time.Second, "B refuses A", func() bool { return rb.Stats().Refused["fingerprint"] > 0 })
	time.Sleep(100 * time.Millisecond)
	if l := load(b, 1); l.ActiveRequests != 0 || b.Remote().Total() != 0 {
		t.Fatalf("B applied a refused replica's booking: %+v", l)
	}
	if rb.Stats().Peers != 0 {
		t.Fatal("a refused replica counts as a peer")
	}
}

// TestOverBoundBookingsDropped: a replica may hold at most
// MaxRemoteBookings bookings on another; the rest are dropped and counted.
func TestOverBoundBookingsDropped(t *testing.T) {
	s := natsServer(t, 0)
	a, b := testRouter(t), testRouter(t)
	ra := startReplica(t, a, s.ClientURL(), "a", nil)
	rb := startReplica(t, b, s.ClientURL(), "b", func(c *Config) { c.MaxRemoteBookings = 3 })
	waitFor(t, 5*time.Second, "A hears B", func() bool { return ra.Stats().Peers == 1 })
	for i := range 5 {
		reserve(t, a, fmt.Sprintf("a%d", i), 1, []uint64{uint64(i)}, 1)
	}
	waitFor(t, 2*time.Second, "B drops the two over its bound", func() bool { return rb.Stats().Dropped["over_bound"] >= 2 })
	if n := b.Remote().Count("a"); n != 3 {
		t.Fatalf("B holds %d of A's bookings, bound 3", n)
	}
}

// TestIndexDigestDifference: replicas compare their index digests. In
// approximate mode a booking's record is shared, so only what A recorded
// before it joined (three blocks) is a difference on B; what it records
// after is on both.
func TestIndexDigestDifference(t *testing.T) {
	s := natsServer(t, 0)
	a, b := testRouter(t), testRouter(t)
	book := func(hashes ...uint64) {
		t.Helper()
		isl := uint64(16 * len(hashes))
		if _, err := a.SelectAndReserve(&selection.SelectRequest{
			Prompt: selection.Prompt{BlockHashes: hashes, SequenceHashes: hashes, ISLTokens: &isl}}); err != nil {
			t.Fatal(err)
		}
	}
	book(11, 12, 13) // before A joins: never told
	fast := func(c *Config) { c.Heartbeat, c.Lease = 10*time.Millisecond, 200*time.Millisecond }
	startReplica(t, a, s.ClientURL(), "a", fast)
	rb := startReplica(t, b, s.ClientURL(), "b", fast)
	waitFor(t, 5*time.Second, "B sees A's index 3 entries ahead", func() bool { return rb.Stats().DigestDiff["a"] == 3 })
	book(21, 22)
	waitFor(t, 5*time.Second, "B records A's second booking", func() bool { return rb.Stats().ApproxApplied == 1 })
	var entries uint64
	for _, d := range b.Queries().IndexDigests() {
		entries += d.Entries
	}
	if entries != 2 {
		t.Fatalf("B's index holds %d entries, want A's second booking's 2", entries)
	}
	// A digest A took between its booking and B's record of it says 5
	// (A's 5 entries against B's 0); it stands until A's next digest, ten
	// heartbeats (100 ms) on, which a sleep of 100 ms raced. A digest B
	// compares after it recorded the booking was sent after the record;
	// wait for two such (one would do; the second is margin).
	walks := func() int {
		rb.digestMu.Lock()
		defer rb.digestMu.Unlock()
		return rb.digestWalks
	}
	after := walks()
	waitFor(t, 5*time.Second, "two digests compared since B recorded the booking", func() bool { return walks() >= after+2 })
	if d := rb.Stats().DigestDiff["a"]; d != 3 {
		t.Fatalf("digest difference %d after a shared record, want 3", d)
	}
}

// TestOlderEpochsAreStale: the messages of an origin's previous process
// (or link) may still be on their way once its new one has announced. An
// epoch below the origin's current one is stale and ignored; epochs used
// to be compared for difference only, so such a message brought back the
// dead process's bookings and made the new process's next message drop
// its live ones in turn (an operator probe left 6-144 phantom requests
// after a kill -9 and a restart, or fast reloads). Epochs now count on
// from the start's clock, so a new process's are above its last one's.
func TestOlderEpochsAreStale(t *testing.T) {
	s := natsServer(t, 0)
	b := testRouter(t)
	rb := startReplica(t, b, s.ClientURL(), "b", nil)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	send := func(epoch uint64, events ...event) {
		data, err := encode(&envelope{Origin: "a", Fingerprint: 42, Version: "test", Epoch: epoch,
			Events: append([]event{{Kind: kindHeartbeat}}, events...)})
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish(DefaultPrefix+".r.a", data); err != nil {
			t.Fatal(err)
		}
		nc.Flush()
	}
	booking := func(id string) event {
		return event{Kind: kindReserve, ID: id, Model: "default", Group: "default", Worker: 1, Hashes: []uint64{1, 2}, Prefill: 32, Outputs: 1}
	}
	send(100, booking("old1"))
	waitFor(t, 2*time.Second, "B holds the old process's booking", func() bool { return load(b, 1).ActiveRequests == 1 })
	send(200, booking("new1")) // the new process announces
	waitFor(t, 2*time.Second, "B holds the new process's booking alone", func() bool {
		return load(b, 1).ActiveRequests == 1 && b.Remote().Total() == 1
	})
	send(100, booking("old2")) // late, from the old process
	send(200)                  // the new process's heartbeat
	// Waited for, not slept on: a's lease at B is 300 ms from its last
	// message, and a sleep of 200 ms left a stall of 100 ms to drop it.
	waitFor(t, 2*time.Second, "B counts the late message stale", func() bool { return rb.Stats().Dropped["stale_epoch"] >= 1 })
	if got := load(b, 1).ActiveRequests; got != 1 {
		t.Fatalf("B holds %d bookings of a, want the new process's 1", got)
	}
	if rb.Stats().Dropped["stale_epoch"] != 1 {
		t.Fatalf("stale messages counted: %v", rb.Stats().Dropped)
	}
}

// TestUnreachableAtStartIsTold: NATS that cannot be reached when a
// replica starts is logged and counted as an outage once, as a lost link
// is; it used to say nothing (an operator probe: no log line, outages 0).
func TestUnreachableAtStartIsTold(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "nats://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	r := startReplica(t, testRouter(t), url, "a", nil)
	waitFor(t, 5*time.Second, "the first failure counted", func() bool { return r.Stats().Outages == 1 })
	time.Sleep(600 * time.Millisecond) // more attempts fail meanwhile
	if s := r.Stats(); s.Outages != 1 || s.Connected {
		t.Fatalf("outages %d, connected %v; want one outage, told once", s.Outages, s.Connected)
	}
}
