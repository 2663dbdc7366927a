//go:build !race

// Not under the race detector: this test terminates a ZMQ context under a
// running listener on purpose, and zmq4's Context.Term writes a flag that
// NewSocket reads without synchronization (the gateway stops its
// listeners before it terminates, so it never does this), which the
// detector reports whatever the order in time.

package indexer

import (
	"net"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
	zmq "github.com/pebbe/zmq4"
)

// TestReplayEndsWithTheContext: a listener replaying from an endpoint
// that never answers gives up at once when its ZMQ context is terminated,
// rather than receiving ETERM until the replay's deadline, so terminating
// the context (which waits for every socket to close) returns promptly.
// The replay timeout is 30 s; the context must end well before it.
func TestReplayEndsWithTheContext(t *testing.T) {
	deaf, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deaf.Close() })
	dialed := make(chan struct{}, 1)
	go func() {
		for {
			c, err := deaf.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			select {
			case dialed <- struct{}{}:
			default:
			}
		}
	}()
	pubCtx, err := zmq.NewContext() // the publisher's own, so it does not hold up the listener's
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pubCtx.Term() })
	pub := newTestPublisher(t, pubCtx, false)
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	x := New()
	x.ConfigurePartition(part, lbs, false)
	var stats Stats
	l, err := StartListener(zctx, x, &stats, nil, ListenerConfig{Endpoint: pub.pubEP, Replay: "tcp://" + deaf.Addr().String(),
		ReplayTimeout: 30 * time.Second, Partition: part, Rank: selection.Rank{WorkerID: 3}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Stop)
	pub.waitSubscribed()
	prompt := testPrompt(3)
	pub.publish(chunk(EncodingArray, -1, prompt, 0, 10), true)
	eventually(t, "first batch applied", func() bool { return stats.Batches.Load() == 1 })
	pub.jumpTo(5) // a gap: the next message starts a replay
	pub.publish(chunk(EncodingArray, -1, prompt, 10, 20), true)
	eventually(t, "the replay started", func() bool { return stats.Replays.Load() == 1 })
	// Terminate only once the replay's socket is made and connected:
	// zmq4's Context.Term and NewSocket are not safe to run at once.
	// Ending a replay that has not started is not what this tests.
	select {
	case <-dialed:
	case <-time.After(10 * time.Second):
		t.Fatal("the replay never dialed its endpoint")
	}

	ended := make(chan error, 1)
	go func() { ended <- zctx.Term() }()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the context still waits on the listener's sockets 10 s into a 30 s replay")
	}
}
