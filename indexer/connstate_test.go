package indexer

import (
	"net"
	"strings"
	"testing"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestListenerConnectionState: a listener says whether its publisher is
// connected now, on the native dial and on a libzmq SUB: not while the
// publisher is down, then yes once it is up, no once it goes (an engine
// killed while idle publishes nothing, so only the connection tells it
// from an idle one), and yes again when it is back.
func TestListenerConnectionState(t *testing.T) {
	for _, viaLibzmq := range []bool{false, true} {
		name := "native"
		if viaLibzmq {
			name = "libzmq"
		}
		t.Run(name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ep := "tcp://" + ln.Addr().String()
			ln.Close() // nothing listens there yet
			zctx, err := zmq.NewContext()
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = zctx.Term() }()
			x := New()
			x.ConfigurePartition(part, lbs, false)
			l, err := StartListener(zctx, x, new(Stats), nil, ListenerConfig{Endpoint: ep, Partition: part,
				Rank: selection.Rank{WorkerID: 4}, viaLibzmq: viaLibzmq})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Stop()
			if up, known := l.Connected(); up || !known {
				t.Fatalf("publisher down: connected %v, known %v; want false, true", up, known)
			}
			bindPub := func() *zmq.Socket {
				pub, _ := zctx.NewSocket(zmq.XPUB)
				_ = pub.SetLinger(0)
				if err := pub.Bind(ep); err != nil {
					t.Skipf("could not bind %s: %v", ep, err)
				}
				return pub
			}
			pub := bindPub()
			eventually(t, "connected once the publisher is up", func() bool { up, _ := l.Connected(); return up })
			pub.Close()
			eventually(t, "not connected once the publisher is gone", func() bool { up, _ := l.Connected(); return !up })
			pub = bindPub()
			defer pub.Close()
			eventually(t, "connected again once it is back", func() bool { up, _ := l.Connected(); return up })
		})
	}
}

// TestListenerFromANamedInterface: a connect-mode endpoint whose source
// is a network interface (libzmq's tcp://lo:0;127.0.0.1:port, read
// through libzmq) connects. With IPv6 on, libzmq took lo's ::1 as the
// source, from which the IPv4 publisher was never reached.
func TestListenerFromANamedInterface(t *testing.T) {
	zctx := testContext(t)
	pub, _ := zctx.NewSocket(zmq.XPUB)
	_ = pub.SetLinger(0)
	if err := pub.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	bound, _ := pub.GetLastEndpoint()
	x := New()
	x.ConfigurePartition(part, lbs, false)
	l, err := StartListener(zctx, x, new(Stats), nil, ListenerConfig{Endpoint: "tcp://lo:0;" + strings.TrimPrefix(bound, "tcp://"),
		Partition: part, Rank: selection.Rank{WorkerID: 4}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Stop()
	if l.native != nil {
		t.Fatal("a named interface was dialed natively: the test would not reach libzmq")
	}
	eventually(t, "connected from lo", func() bool { up, _ := l.Connected(); return up })
}

// TestLibzmqIPv6: IPv6 stays on for libzmq sockets, except from a source
// to an IPv4 destination.
func TestLibzmqIPv6(t *testing.T) {
	for ep, want := range map[string]bool{
		"tcp://127.0.0.1:5557":         true,
		"tcp://[::1]:5557":             true,
		"tcp://lo:0;127.0.0.1:5557":    false,
		"tcp://eth0:0;10.0.0.2:5557":   false,
		"tcp://lo:0;[::1]:5557":        true,
		"tcp://lo:0;worker.local:5557": true,
		"inproc://kv":                  true,
	} {
		if got := libzmqIPv6(ep); got != want {
			t.Errorf("libzmqIPv6(%q) = %v, want %v", ep, got, want)
		}
	}
}
