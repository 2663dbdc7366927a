package indexer

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// handPublisher is a publisher written by hand over TCP: it greets each
// subscriber that dials as a PUB would, and then sends what a test tells
// it, frames without end included, which a libzmq PUB cannot.
type handPublisher struct {
	ln net.Listener
	ep string
}

func newHandPublisher(t *testing.T) *handPublisher {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return &handPublisher{ln: ln, ep: "tcp://" + ln.Addr().String()}
}

// accept takes the next subscriber and completes its handshake.
func (p *handPublisher) accept(t *testing.T) net.Conn {
	t.Helper()
	_ = p.ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
	c, err := p.ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	greetAsPublisher(t, c)
	return c
}

// greetAsPublisher greets a subscriber on c as a PUB and reads its
// handshake, checking its subscription to every topic (a ZMTP 3.0 message
// from the gateway's own subscriber, a 3.1 SUBSCRIBE command from libzmq).
func greetAsPublisher(t *testing.T, c net.Conn) {
	t.Helper()
	if _, err := c.Write(append(zmtpGreetingFor(3, "NULL"), readyCommand("PUB")...)); err != nil {
		t.Fatal(err)
	}
	in := make([]byte, zmtpGreeting+len(readyCommand("SUB"))+2)
	if _, err := io.ReadFull(c, in); err != nil {
		t.Fatal(err)
	}
	sub := make([]byte, in[len(in)-1])
	if _, err := io.ReadFull(c, sub); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(sub, []byte{1}) && !bytes.Equal(sub, []byte("\x09SUBSCRIBE")) {
		t.Fatalf("subscription % x", sub)
	}
}

// TestListenerHoldsNoFrameFlood: a registered publisher that sends one
// message of endless 1 MiB frames is cut at the fourth frame's header,
// with the process's resident set all but unmoved (libzmq held every
// frame until the message's last, which never comes: 2 GB for 500), and
// dialed again; the new connection's batch is applied.
func TestListenerHoldsNoFrameFlood(t *testing.T) {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = zctx.Term() }()
	pub := newHandPublisher(t)
	x, stats := New(), new(Stats)
	x.ConfigurePartition(part, lbs, false)
	l, err := StartListener(zctx, x, stats, nil, ListenerConfig{Endpoint: pub.ep, Partition: part, Rank: selection.Rank{WorkerID: 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Stop()
	c := pub.accept(t)
	go func() { _, _ = io.Copy(io.Discard, c) }()
	before := rssBytes(t)
	if _, err := c.Write(zmtpFrame(zmtpMore, []byte("kv@3@m"), false)); err != nil {
		t.Fatal(err)
	}
	floodCut(t, c, before)
	eventually(t, "the cut counted", func() bool { return stats.Cut.Load() == 1 })
	// Dialed again: the next connection is heard.
	c = pub.accept(t)
	prompt := testPrompt(61)
	msg := zmtpMessage([]byte("kv@3@m"), binary.BigEndian.AppendUint64(nil, 0), chunk(EncodingArray, -1, prompt, 0, 4))
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the batch after the cut", func() bool { return x.Blocks(part, selection.Rank{WorkerID: 3}) == 4 })
}

// TestListenerStopsWhileDialing: a listener stops at once, without a
// goroutine left (TestMain checks), whether its publisher refuses
// connections (it dials again and again, and says so once as a warning),
// or accepts and never greets (the handshake waits).
func TestListenerStopsWhileDialing(t *testing.T) {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = zctx.Term() }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	silent := "tcp://" + ln.Addr().String()
	defer ln.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusing := "tcp://" + closed.Addr().String()
	closed.Close()
	for _, ep := range []string{refusing, silent} {
		core, logs := observer.New(zap.DebugLevel)
		l, err := StartListener(zctx, New(), new(Stats), zap.New(core), ListenerConfig{Endpoint: ep, Partition: part})
		if err != nil {
			t.Fatal(err)
		}
		if l.native == nil {
			t.Fatalf("%s: not dialed natively", ep)
		}
		if ep == refusing {
			eventually(t, "a second dial", func() bool { return logs.FilterMessageSnippet("cannot reach the publisher").Len() >= 2 })
		} else {
			time.Sleep(300 * time.Millisecond) // a handshake under way
		}
		start := time.Now()
		l.Stop()
		if took := time.Since(start); took > time.Second {
			t.Fatalf("%s: Stop took %v", ep, took)
		}
		// The refusing publisher, dialed a few times: one warning, then
		// debug lines.
		if warned := logs.FilterMessageSnippet("cannot reach the publisher").FilterLevelExact(zap.WarnLevel).Len(); ep == refusing && warned != 1 {
			t.Fatalf("%s: %d failed dials logged as warnings, want 1", ep, warned)
		}
	}
}

// TestListenerCountsFailedDials: every connect-mode dial that does not
// end in a subscription is counted, whether the publisher refuses the
// connection or answers with something other than a ZMTP 3 greeting; the
// log says so once, the count goes on.
func TestListenerCountsFailedDials(t *testing.T) {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = zctx.Term() }()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusing := "tcp://" + closed.Addr().String()
	closed.Close()
	// An HTTP server where the publisher should be: it answers the
	// greeting's first bytes with a 400 and hangs up.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n"))
			c.Close()
		}
	}()
	for _, ep := range []string{refusing, "tcp://" + ln.Addr().String()} {
		core, logs := observer.New(zap.DebugLevel)
		stats := new(Stats)
		l, err := StartListener(zctx, New(), stats, zap.New(core), ListenerConfig{Endpoint: ep, Partition: part})
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, "three failed dials counted", func() bool { return stats.DialFailures.Load() >= 3 })
		l.Stop()
		if logged, counted := logs.FilterMessageSnippet("cannot reach the publisher").Len(), stats.DialFailures.Load(); uint64(logged) != counted {
			t.Errorf("%s: %d failed dials logged, %d counted", ep, logged, counted)
		}
		if got := stats.Disconnects.Load() + stats.Cut.Load(); got != 0 {
			t.Errorf("%s: failed dials also counted as %d disconnects or cuts", ep, got)
		}
	}
}

// TestListenerTransports: a libzmq publisher on tcp:// or ipc:// is read
// natively, with libzmq's source;destination form too (the connection
// comes from the source given, as libzmq's SUB would dial it); on
// inproc:// through a libzmq SUB (TestDialTargets has the other endpoints
// left to libzmq). Either way its batch is applied.
func TestListenerTransports(t *testing.T) {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = zctx.Term() }) // last: cleanups run in reverse
	dir := t.TempDir()
	for i, c := range []struct {
		bind   string
		dial   func(bound string) string
		native bool
		from   string // the peer address the publisher must see ("" for any)
	}{
		{"tcp://127.0.0.1:*", func(ep string) string { return ep }, true, ""},
		{"ipc://" + dir + "/pub", func(ep string) string { return ep }, true, ""},
		{"inproc://kv-transports", func(ep string) string { return ep }, false, ""},
		{"tcp://127.0.0.1:*", func(ep string) string { return "tcp://127.0.0.2:0;" + ep[len("tcp://"):] }, true, "127.0.0.2"},
	} {
		pub, err := zctx.NewSocket(zmq.XPUB)
		if err != nil {
			t.Fatal(err)
		}
		_ = pub.SetLinger(0)
		t.Cleanup(func() { pub.Close() }) // before the context's Term, which waits for it
		if err := pub.Bind(c.bind); err != nil {
			t.Fatal(err)
		}
		bound, _ := pub.GetLastEndpoint()
		x, stats := New(), new(Stats)
		x.ConfigurePartition(part, lbs, false)
		rank := selection.Rank{WorkerID: uint64(i + 1)}
		l, err := StartListener(zctx, x, stats, nil, ListenerConfig{Endpoint: c.dial(bound), Partition: part, Rank: rank})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Stop)
		if got := l.native != nil; got != c.native {
			t.Errorf("%s: read natively %v, want %v", c.dial(bound), got, c.native)
		}
		_ = pub.SetRcvtimeo(5 * time.Second)
		f, meta, err := pub.RecvMessageWithMetadata(0, "Peer-Address")
		if err != nil || len(f) == 0 || len(f[0]) == 0 || f[0][0] != 1 {
			t.Fatalf("%s: no subscription: %v", c.dial(bound), err)
		}
		if c.from != "" && meta["Peer-Address"] != c.from {
			t.Errorf("%s: dialed from %q, want %q", c.dial(bound), meta["Peer-Address"], c.from)
		}
		prompt := testPrompt(uint32(70 + i))
		if _, err := pub.SendMessage([]byte{}, binary.BigEndian.AppendUint64(nil, 0), chunk(EncodingArray, -1, prompt, 0, 4)); err != nil {
			t.Fatal(err)
		}
		eventually(t, c.dial(bound)+" applied", func() bool { return x.Blocks(part, rank) == 4 })
	}
}
