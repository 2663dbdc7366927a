package indexer

import (
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// gateWorker is the one worker the gate tests publish for.
func gateWorker() *selection.WorkerRequest {
	return &selection.WorkerRequest{WorkerID: ptr(uint64(5)), ModelName: ptr("m"),
		Endpoint: ptr("127.0.0.1:8000"), BlockSize: ptr(uint32(lbs))}
}

// dialGate binds a listener for gateWorker's publisher and dials it over
// TCP, as a publisher that speaks ZMTP by hand; the connection is closed
// at the test's end.
func dialGate(t *testing.T, opts ...ManagerOption) (*Manager, *BindListener, net.Conn) {
	t.Helper()
	r, m := eventRouter(t, true, opts...)
	b, err := m.Bind("tcp://127.0.0.1:*", ResolverFor(r))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Catalog().UpsertWorker(gateWorker()); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", strings.TrimPrefix(b.Endpoint(), "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return m, b, c
}

// TestBindGateCutsLongMessages: a real libzmq PUB that sends a message of
// more frames than a live message has, or of more bytes in all than the
// message bound while each frame is within it, is cut off; nothing of
// that message reaches the index, and the publisher's next connection
// (libzmq dials again) is heard as before.
func TestBindGateCutsLongMessages(t *testing.T) {
	const bound = 64 << 10
	r, m := eventRouter(t, true, WithMaxMessageBytes(bound))
	pub := bindPublisher(t, r, m, gateWorker())
	prompt := testPrompt(21)
	seqFrame := func(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }
	eventually(t, "the first batch", func() bool {
		_, _ = pub.SendMessage("kv@5@m", seqFrame(0), chunk(EncodingArray, -1, prompt, 0, 4))
		return m.stats.Batches.Load() >= 1
	})
	messages := m.stats.Messages.Load()
	// Four frames, each small: cut at the fourth frame's header.
	if _, err := pub.SendMessage("kv@5@m", seqFrame(1), chunk(EncodingArray, -1, prompt, 4, 8), "extra"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a cut for four frames", func() bool { return m.stats.Cut.Load() == 1 })
	// The publisher dials again; until it has, its messages are dropped
	// on its side, so send until one lands, each under the next sequence
	// (a repeated one would be taken as a restart).
	key := selection.PartitionKey{Model: "m", Group: "default"}
	seq := uint64(1)
	landed := func(to int) func() bool {
		return func() bool {
			_, _ = pub.SendMessage("kv@5@m", seqFrame(seq), chunk(EncodingArray, -1, prompt, 0, to))
			seq++
			return m.Index.Blocks(key, selection.Rank{WorkerID: 5}) == to
		}
	}
	eventually(t, "the next batch", landed(8))
	// Three frames, each under the bound, over it together.
	big := make([]byte, bound/2+1)
	if _, err := pub.SendMessage("kv@5@m", big, big); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a cut for the bytes", func() bool { return m.stats.Cut.Load() == 2 })
	eventually(t, "the batch after it", landed(12))
	// Only whole, well-framed messages were received: the cut ones never
	// reached the SUB's reader, as malformed or otherwise.
	if got := m.stats.Malformed.Load(); got != 0 {
		t.Fatalf("%d malformed messages: a cut message was delivered in part", got)
	}
	if got := m.stats.Messages.Load() - messages; got == 0 {
		t.Fatal("no message after the cuts")
	}
}

// TestBindGateBoundsPeers: past WithMaxPeers publishers connected at once,
// a further connection is closed at once and counted; stopping the
// manager closes the connections the gate holds.
func TestBindGateBoundsPeers(t *testing.T) {
	r, m := eventRouter(t, true, WithMaxPeers(2))
	b, err := m.Bind("tcp://127.0.0.1:*", ResolverFor(r))
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(b.Endpoint(), "tcp://")
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// A held connection gets the SUB's greeting through the gate.
	held := []net.Conn{dial(), dial()}
	for _, c := range held {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, 10)); err != nil {
			t.Fatalf("a connection within the bound: %v", err)
		}
	}
	third := dial()
	_ = third.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := third.Read(make([]byte, 64)); err != io.EOF {
		t.Fatalf("the third connection read %d bytes, %v; want it closed", n, err)
	}
	if got := m.stats.TurnedAway.Load(); got != 1 {
		t.Fatalf("turned away %d, want 1", got)
	}
	// One goes; a new one is let in.
	held[0].Close()
	eventually(t, "a place freed", func() bool {
		c := dial()
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := io.ReadFull(c, make([]byte, 10))
		return err == nil
	})
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	_ = held[1].SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(held[1]); err != nil {
		t.Fatalf("after Close, a held connection: %v; want it closed", err)
	}
}

// TestBindPeerMustGreet: a connection that never greets as a publisher
// holds its place among max_peers only for the handshake's timeout; it is
// then closed and counted as a disconnect, and a real publisher takes the
// place and is heard.
func TestBindPeerMustGreet(t *testing.T) {
	m, b, silent := dialGate(t, WithMaxPeers(1))
	start := time.Now()
	_ = silent.SetReadDeadline(start.Add(20 * time.Second))
	if _, err := io.ReadAll(silent); err != nil {
		t.Fatalf("a peer that does not greet: %v; want it closed", err)
	}
	t.Logf("closed after %v", time.Since(start).Round(time.Millisecond))
	if got := m.stats.Disconnects.Load(); got != 1 {
		t.Fatalf("disconnects %d, want 1", got)
	}
	pctx, _ := zmq.NewContext()
	pub, _ := pctx.NewSocket(zmq.PUB)
	_ = pub.SetLinger(0)
	defer func() { pub.Close(); _ = pctx.Term() }()
	if err := pub.Connect(b.Endpoint()); err != nil {
		t.Fatal(err)
	}
	prompt := testPrompt(31)
	var seq uint64
	eventually(t, "the publisher's batch", func() bool {
		_, _ = pub.SendMessage("kv@5@m", binary.BigEndian.AppendUint64(nil, seq), chunk(EncodingArray, -1, prompt, 0, 4))
		seq++
		return m.stats.Batches.Load() >= 1
	})
}

// TestBindConnectionsShareAWorker: two connections under one worker's
// topic (a publisher that dialed again before its old connection was seen
// to close), both sending as fast as they can, take turns at the worker's
// stream, with one ingest turn between them: every message is applied and
// neither reader waits forever for the other.
func TestBindConnectionsShareAWorker(t *testing.T) {
	const each = 2000
	x := New()
	x.IngestCores = 1
	// A deadlock shows as the run's timeout, with every goroutine's
	// stack: the cleanup's Close waits for the readers.
	r, m := eventRouterOn(t, x, true)
	b, err := m.Bind("tcp://127.0.0.1:*", ResolverFor(r))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Catalog().UpsertWorker(gateWorker()); err != nil {
		t.Fatal(err)
	}
	pctx, _ := zmq.NewContext()
	defer func() { _ = pctx.Term() }()
	var pubs []*zmq.Socket
	for range 2 {
		pub, _ := pctx.NewSocket(zmq.XPUB)
		_ = pub.SetLinger(0)
		_ = pub.SetSndhwm(0)
		_ = pub.SetRcvtimeo(10 * time.Second)
		defer pub.Close()
		if err := pub.Connect(b.Endpoint()); err != nil {
			t.Fatal(err)
		}
		if _, err := pub.RecvBytes(0); err != nil {
			t.Fatalf("no subscription: %v", err)
		}
		pubs = append(pubs, pub)
	}
	payload := chunk(EncodingArray, -1, testPrompt(41), 0, 4)
	for i := range uint64(each) {
		for _, pub := range pubs {
			if _, err := pub.SendMessage("kv@5@m", binary.BigEndian.AppendUint64(nil, i), payload); err != nil {
				t.Fatal(err)
			}
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for m.stats.Batches.Load() < 2*each {
		if time.Now().After(deadline) {
			t.Fatalf("%d batches of %d applied after 30 s", m.stats.Batches.Load(), 2*each)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBindGateEndpoints: the endpoints the gate stands in front of, in
// libzmq's spelling, and the one it leaves to libzmq.
func TestBindGateEndpoints(t *testing.T) {
	for _, c := range []struct{ in, network, addr string }{
		{"tcp://*:5557", "tcp", ":5557"},
		{"tcp://127.0.0.1:*", "tcp", "127.0.0.1:0"},
		{"tcp://[::1]:5557", "tcp", "[::1]:5557"},
		{"ipc:///run/kv.sock", "unix", "/run/kv.sock"},
	} {
		network, addr, ok, err := gateNetwork(c.in)
		if err != nil || !ok || network != c.network || addr != c.addr {
			t.Errorf("%s: %s %s %v %v", c.in, network, addr, ok, err)
		}
	}
	if _, _, ok, err := gateNetwork("inproc://events"); ok || err != nil {
		t.Errorf("inproc: gated %v, %v", ok, err)
	}
	for _, bad := range []string{"tcp://nohost", "ipc://*"} {
		if _, _, _, err := gateNetwork(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// rssBytes is the process's resident set, from /proc.
func rssBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status")
	}
	for line := range strings.Lines(string(b)) {
		if kb, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(kb), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestBindGateHoldsNoFrameFlood: a peer that speaks ZMTP by hand and
// sends one message of endless 1 MiB frames, each within the frame bound,
// is cut off at its fourth frame. Without the gate, libzmq kept every
// frame until the message's last, which never comes: 256 frames held
// 256 MiB, in C, where no Go bound sees it.
func TestBindGateHoldsNoFrameFlood(t *testing.T) {
	m, _, c := dialGate(t)
	before := rssBytes(t)
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	// Publish once subscribed, as a PUB does.
	greetAsPublisher(t, c)
	go func() { _, _ = io.Copy(io.Discard, c) }()
	if _, err := c.Write(zmtpFrame(zmtpMore, []byte("kv@5@m"), false)); err != nil {
		t.Fatal(err)
	}
	floodCut(t, c, before)
	if m.stats.Cut.Load() != 1 {
		t.Fatalf("cut %d, want 1", m.stats.Cut.Load())
	}
}

// floodCut writes on c, whose message's first frame is sent, frames of
// 1 MiB with more set, up to 256, as a message that never ends, and checks
// that the connection broke before the last and that the process's
// resident set grew at most 64 MiB from before.
func floodCut(t *testing.T, c net.Conn, before int64) {
	t.Helper()
	const frames, frameSize = 256, 1 << 20
	header := zmtpFrame(zmtpMore|zmtpLong, nil, true)
	binary.BigEndian.PutUint64(header[1:], frameSize)
	body := make([]byte, frameSize)
	sent := 0
	for ; sent < frames; sent++ {
		if _, err := c.Write(header); err != nil {
			break
		}
		if _, err := c.Write(body); err != nil {
			break
		}
	}
	// Let the receiver take whatever reached it before measuring.
	time.Sleep(200 * time.Millisecond)
	grown := rssBytes(t) - before
	t.Logf("%d frames written before the cut; resident set grew %d MiB", sent, grown>>20)
	if sent == frames {
		t.Fatalf("all %d frames of one message were taken", frames)
	}
	if grown > 64<<20 {
		t.Fatalf("the resident set grew %d MiB", grown>>20)
	}
}

// TestBindGateTakesOverAStaleSocketFile: an ipc endpoint whose socket file
// a crashed process left behind is bound again, as libzmq would; one that
// a live process listens on is not taken from it.
func TestBindGateTakesOverAStaleSocketFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	_, m := eventRouter(t, true)
	if _, err := m.Bind("ipc://"+path, func(uint64, string) (ListenerConfig, bool) { return ListenerConfig{}, false }); err == nil {
		t.Fatal("bound over a live listener's socket file")
	}
	ln.Close() // the file stays, as after a crash
	_, m = eventRouter(t, true)
	if _, err := m.Bind("ipc://"+path, func(uint64, string) (ListenerConfig, bool) { return ListenerConfig{}, false }); err != nil {
		t.Fatalf("a stale socket file: %v", err)
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 10)); err != nil {
		t.Fatalf("no greeting through the gate: %v", err)
	}
}
