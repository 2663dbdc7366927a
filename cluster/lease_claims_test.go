package cluster

import (
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// publishLeased sends events as origin claiming leaseMs, in the test
// replicas' settings (or with fingerprint fp).
func publishLeased(t *testing.T, url, origin string, fp, leaseMs uint64, events []event) {
	t.Helper()
	nc := hostilePeer(t, url)
	publish(t, nc, &envelope{Origin: origin, Fingerprint: fp, Version: "test", Epoch: 1, LeaseMs: leaseMs, Events: events})
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestLongLeaseNamesDoNotLockOutAReplica: eight names claiming the
// longest lease (ten minutes) with a full share of bookings each filled
// the table, and a real replica's bookings were refused (over_bound) for
// as long as the names' lease ran. Now the real replica books up to its
// fair share in place of theirs, and the metrics say whose bookings the
// table holds.
func TestLongLeaseNamesDoNotLockOutAReplica(t *testing.T) {
	s := natsServer(t, 0)
	a, b := testRouter(t), testRouter(t)
	const perOrigin = 10
	tune := func(c *Config) { c.MaxRemoteBookings = perOrigin }
	_, rb := joinedPair(t, a, b, s.ClientURL(), tune)
	for o := range 8 {
		events := make([]event, perOrigin)
		for i := range events {
			events[i] = event{Kind: kindReserve, ID: fmt.Sprint(i), Model: "default", Group: "default", Worker: 2, Prefill: 1000}
		}
		publishLeased(t, s.ClientURL(), fmt.Sprint("fake", o), 42, uint64(maxPeerLease/time.Millisecond), events)
	}
	waitFor(t, 5*time.Second, "b holds the fake names' bookings", func() bool { return b.Remote().Total() == 8*perOrigin })
	for i := range 8 { // a's fair share of 80 over 9 names: 8
		reserve(t, a, fmt.Sprint("a", i), 1, []uint64{uint64(i + 1)}, 40)
	}
	waitFor(t, 5*time.Second, "a's bookings on b", func() bool { return b.Remote().Count("a") == 8 })
	st := rb.Stats()
	if st.RemoteEvicted != 8 || st.RemoteByReplica["a"] != 8 || st.RemoteBookings != 8*perOrigin || st.Dropped["over_bound"] != 0 {
		t.Fatalf("evicted %d, by replica %v, total %d, over bound %d; want 8, a 8, %d, 0",
			st.RemoteEvicted, st.RemoteByReplica, st.RemoteBookings, st.Dropped["over_bound"], 8*perOrigin)
	}
	if l := load(b, 1); l.ActiveRequests != 8 {
		t.Fatalf("worker 1 on b counts %d of a's requests, want 8", l.ActiveRequests)
	}
}

// TestClaimedLeaseIsAtLeastTwoHeartbeats: a lease claimed below twice
// the receiver's heartbeat is held at that: a claim of 1 ms made its
// sender lapse between its messages, its bookings dropped and taken back
// on each, and every return asked all replicas to announce.
func TestClaimedLeaseIsAtLeastTwoHeartbeats(t *testing.T) {
	s := natsServer(t, 0)
	b := testRouter(t)
	rb := startReplica(t, b, s.ClientURL(), "b", nil) // heartbeat 50ms, lease 300ms
	booking := event{Kind: kindReserve, ID: "x", Model: "default", Group: "default", Worker: 1, Prefill: 100}
	publishLeased(t, s.ClientURL(), "brief", 42, 1, []event{booking})
	waitFor(t, 5*time.Second, "b holds the booking", func() bool { return b.Remote().Count("brief") == 1 })
	for range 20 { // a message every 40 ms: within twice b's heartbeat
		time.Sleep(40 * time.Millisecond)
		publishLeased(t, s.ClientURL(), "brief", 42, 1, []event{{Kind: kindHeartbeat}})
	}
	if n, lapsed := b.Remote().Count("brief"), rb.Stats().LeaseExpiries; n != 1 || lapsed != 0 {
		t.Fatalf("a sender claiming 1 ms: %d bookings held, %d lease expiries; want 1 and 0", n, lapsed)
	}
	waitFor(t, 5*time.Second, "the silent sender lapses", func() bool { return b.Remote().Count("brief") == 0 })
}

// TestRefusalIsLoggedAgainAfterAcceptance: the refusal of a replica with
// other settings is logged once, and again after its messages were
// accepted in between (the next rollout's mismatch): before, only the
// first refusal in the process's life was.
func TestRefusalIsLoggedAgainAfterAcceptance(t *testing.T) {
	s := natsServer(t, 0)
	core, logs := observer.New(zapcore.WarnLevel)
	rb := startReplica(t, testRouter(t), s.ClientURL(), "b", func(c *Config) { c.Logger = zap.New(core) })
	refusals := func() int {
		return logs.FilterMessageSnippet("refusing messages").Len()
	}
	refused := uint64(0)
	for _, fp := range []uint64{7, 7, 42, 7} {
		publishLeased(t, s.ClientURL(), "rolling", fp, 0, []event{{Kind: kindHeartbeat}})
		if fp == 42 {
			waitFor(t, 5*time.Second, "the matching message accepted", func() bool { return rb.Stats().Peers == 1 })
			continue
		}
		refused++
		waitFor(t, 5*time.Second, "the refusal counted", func() bool { return rb.Stats().Refused["fingerprint"] == refused })
	}
	if n := refusals(); n != 2 {
		t.Fatalf("%d refusals logged, want 2 (the first, and the first after acceptance)", n)
	}
}
