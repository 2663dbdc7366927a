package indexer

import (
	"fmt"
	"os"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// openDescriptors is the process's open file descriptors.
func openDescriptors(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(fds)
}

// testContext is a ZMQ context ended when the test ends (after the
// sockets the test closes in its own cleanups, registered later).
func testContext(t *testing.T) *zmq.Context {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = zctx.Term() })
	return zctx
}

// TestLibzmqListenersReleaseTheirSockets: a listener read through libzmq
// (connect mode, and bind mode on inproc) gives its SUB and its monitor's
// sockets back when it stops, while the context lives on (a reload keeps
// it). Closed with the monitor still attached, each left three
// descriptors (libzmq's mailboxes) and three sockets in the context until
// it ended: a reload toggling one such worker grew the gateway by 3 each
// time, and every socket closed in that context afterwards leaked too.
func TestLibzmqListenersReleaseTheirSockets(t *testing.T) {
	zctx := testContext(t)
	x := New()
	x.ConfigurePartition(part, lbs, false)
	pub, _ := zctx.NewSocket(zmq.XPUB)
	_ = pub.SetLinger(0)
	if err := pub.Bind("inproc://release-test"); err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	cycle := func(i int) {
		l, err := StartListener(zctx, x, new(Stats), nil, ListenerConfig{Endpoint: "inproc://release-test", Partition: part,
			Rank: selection.Rank{WorkerID: 4}, viaLibzmq: true})
		if err != nil {
			t.Fatal(err)
		}
		if l.mon == nil {
			t.Fatal("the listener has no monitor: the test would not reach its sockets")
		}
		l.Stop()
		_, _ = pub.GetEvents() // the XPUB ends its side of the SUB's pipe only when used
		resolve := func(uint64, string) (ListenerConfig, bool) { return ListenerConfig{}, false }
		b, err := StartBindListener(zctx, x, new(Stats), nil, fmt.Sprintf("inproc://release-bind-%d", i), resolve)
		if err != nil {
			t.Fatal(err)
		}
		b.Stop()
	}
	cycle(0) // the context's own first costs (its I/O thread, reaper)
	time.Sleep(100 * time.Millisecond)
	before := openDescriptors(t)
	const cycles = 30
	for i := 1; i <= cycles; i++ {
		cycle(i)
	}
	// libzmq's reaper closes a socket's mailbox after zmq_close returns.
	deadline := time.Now().Add(10 * time.Second)
	for openDescriptors(t) > before+4 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		_, _ = pub.GetEvents()
	}
	if after := openDescriptors(t); after > before+4 {
		t.Fatalf("%d listener cycles: descriptors %d -> %d; want them given back", cycles, before, after)
	}
}

// TestListenerRefusedAtConnectReleasesItsSockets: a libzmq listener whose
// endpoint libzmq refuses at connect gives its SUB and its monitor's
// sockets back.
func TestListenerRefusedAtConnectReleasesItsSockets(t *testing.T) {
	zctx := testContext(t)
	x := New()
	x.ConfigurePartition(part, lbs, false)
	start := func() {
		if _, err := StartListener(zctx, x, new(Stats), nil, ListenerConfig{Endpoint: "nosuch://endpoint", Partition: part,
			Rank: selection.Rank{WorkerID: 4}, viaLibzmq: true}); err == nil {
			t.Fatal("an endpoint of no transport was connected")
		}
	}
	start() // the context's own first costs
	time.Sleep(100 * time.Millisecond)
	before := openDescriptors(t)
	for range 30 {
		start()
	}
	deadline := time.Now().Add(10 * time.Second)
	for openDescriptors(t) > before+4 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if after := openDescriptors(t); after > before+4 {
		t.Fatalf("30 refused listeners: descriptors %d -> %d; want them given back", before, after)
	}
}
