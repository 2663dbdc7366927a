package indexer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// connPair is a zmtpConn reading one end of a socket pair, and the other
// end, which the test writes as the publisher.
func connPair(t *testing.T, maxBytes int64) (*zmtpConn, int) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.SetNonblock(fds[0], true); err != nil {
		t.Fatal(err)
	}
	z := newZMTPConn(fds[0], maxBytes)
	t.Cleanup(func() { z.close(); syscall.Close(fds[1]) })
	return z, fds[1]
}

func writeAll(t *testing.T, fd int, b []byte) {
	t.Helper()
	for len(b) > 0 {
		n, err := syscall.Write(fd, b)
		if err != nil {
			t.Fatal(err)
		}
		b = b[n:]
	}
}

// TestZMTPConnReadsMessages: whole messages come out of a stream written
// in pieces of any size (a PING between messages, and one between a
// message's frames, answered with a PONG of its context each), and
// EAGAIN whenever what was written is taken; a message bigger than the
// starting buffer grows it, and the buffer shrinks after.
func TestZMTPConnReadsMessages(t *testing.T) {
	ping := zmtpFrame(zmtpCommand, append([]byte{4}, "PING\x00\x10ctx"...), false)
	big := bytes.Repeat([]byte{7}, 3*zmtpBufKeep)
	msgs := [][][]byte{
		{[]byte("kv@5@m"), binary.BigEndian.AppendUint64(nil, 1), []byte("one")},
		{nil, make([]byte, 8), nil},
		{[]byte("t"), binary.BigEndian.AppendUint64(nil, 3), big},
		{[]byte("short")}, // a message of one frame: the listener counts it malformed
	}
	var stream []byte
	for i, m := range msgs {
		enc := zmtpMessage(m...)
		if i == 1 { // a PING between the first and second frames
			first := len(zmtpFrame(zmtpMore, m[0], false))
			enc = append(append(append([]byte(nil), enc[:first]...), ping...), enc[first:]...)
		}
		stream = append(append(stream, ping...), enc...)
	}
	for _, piece := range []int{1, 7, 100, 4096, len(stream)} {
		z, peer := connPair(t, 1<<20)
		var got [][][]byte
		for at := 0; at < len(stream); at += piece {
			writeAll(t, peer, stream[at:min(at+piece, len(stream))])
			for {
				frames, err := z.next()
				if isAgain(err) {
					break
				}
				if err != nil {
					t.Fatalf("pieces of %d: %v", piece, err)
				}
				var copied [][]byte
				for _, f := range frames {
					copied = append(copied, bytes.Clone(f))
				}
				got = append(got, copied)
			}
		}
		if len(got) != len(msgs) {
			t.Fatalf("pieces of %d: %d messages, want %d", piece, len(got), len(msgs))
		}
		for i := range msgs {
			for j := range msgs[i] {
				if !bytes.Equal(got[i][j], msgs[i][j]) {
					t.Fatalf("pieces of %d: message %d frame %d differs", piece, i, j)
				}
			}
		}
		if len(z.buf) != zmtpBufStart {
			t.Fatalf("pieces of %d: the buffer kept %d bytes", piece, len(z.buf))
		}
		pongs := make([]byte, 1024)
		n, _ := syscall.Read(peer, pongs)
		pong := append([]byte{zmtpCommand, 8, 4}, "PONGctx"...)
		if want := bytes.Repeat(pong, len(msgs)+1); !bytes.Equal(pongs[:n], want) {
			t.Fatalf("pieces of %d: pongs % x, want % x", piece, pongs[:n], want)
		}
	}
}

// TestZMTPConnRefuses: a fourth frame, a message over the byte bound, a
// command over it, commands inside a message that add up past it (the
// buffer holds them until the message is whole) and bad flags break the
// connection at their header, before the body is read; a closed
// connection is io.EOF.
func TestZMTPConnRefuses(t *testing.T) {
	one := []byte("kv@5@m")
	for _, c := range []struct {
		name, want string
		stream     []byte
	}{
		{"a fourth frame", "more than 3 frames",
			append(append(append(zmtpFrame(zmtpMore, one, false), zmtpFrame(zmtpMore, make([]byte, 8), false)...), zmtpFrame(zmtpMore, one, false)...), 0, 0)},
		{"over the byte bound", "more than 300 bytes",
			append(zmtpFrame(zmtpMore, one, false), zmtpLong|zmtpMore, 0, 0, 0, 0, 0, 0, 1, 0x27)}, // 6 + 295
		{"a command over the bound", "more than 300 bytes", []byte{zmtpCommand | zmtpLong, 0, 0, 0, 0, 0, 0, 1, 0x2d}},
		{"commands inside a message past the byte bound", "more than 300 bytes",
			append(zmtpFrame(zmtpMore, one, false), bytes.Repeat(zmtpFrame(zmtpCommand, make([]byte, 20), false), 14)...)},
		{"empty commands without end inside a message", "more than 16 commands",
			append(zmtpFrame(zmtpMore, one, false), bytes.Repeat([]byte{zmtpCommand, 0}, 200)...)},
		{"a command over 1 KiB before any message", "a command of 1025 bytes", []byte{zmtpCommand | zmtpLong, 0, 0, 0, 0, 0, 0, 4, 1}},
		{"a command with more", "frame flags", []byte{zmtpCommand | zmtpMore, 0}},
		{"reserved flags", "frame flags", []byte{0x08, 0}},
	} {
		z, peer := connPair(t, 300)
		writeAll(t, peer, c.stream)
		_, err := z.next()
		if !errors.Is(err, errZMTP) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	z, peer := connPair(t, 300)
	writeAll(t, peer, zmtpFrame(zmtpMore, one, false))
	syscall.Close(peer)
	if _, err := z.next(); err != io.EOF {
		t.Fatalf("a closed connection: %v, want EOF", err)
	}
}

// TestZMTPConnChecksTopics: with a topic check (bind mode), a message's
// topic is shown as soon as its frame is whole, once however the message
// is split, and a refused one breaks the connection before the rest of the
// message is read; a topic over maxTopicBytes is refused at its header.
func TestZMTPConnChecksTopics(t *testing.T) {
	refused := errors.New("refused")
	var shown []string
	check := func(topic []byte) error {
		shown = append(shown, string(topic))
		if string(topic) != "kv@5@m" {
			return refused
		}
		return nil
	}
	z, peer := connPair(t, 1<<20)
	z.onTopic = check
	msg := append(append(zmtpFrame(zmtpMore, []byte("kv@5@m"), false), zmtpFrame(zmtpMore, make([]byte, 8), false)...),
		zmtpFrame(0, make([]byte, 500), true)...)
	pieces := [][]byte{msg[:8], msg[8:20], msg[20:300], msg[300:]}
	for i, piece := range pieces {
		writeAll(t, peer, piece)
		frames, err := z.next()
		if i < len(pieces)-1 {
			if !isAgain(err) {
				t.Fatalf("a part of the message: %v, want EAGAIN", err)
			}
			continue
		}
		if err != nil || len(frames) != 3 {
			t.Fatalf("the whole message: %d frames, %v", len(frames), err)
		}
	}
	if !slices.Equal(shown, []string{"kv@5@m"}) {
		t.Fatalf("topics shown %q, want the one topic once", shown)
	}

	// A refused topic, its message's payload announced but not sent.
	shown = nil
	forged := zmtpFrame(zmtpMore, []byte("kv@6@m"), false)
	forged = append(forged, zmtpFrame(zmtpMore, make([]byte, 8), false)...)
	forged = append(forged, zmtpLong, 0, 0, 0, 0, 0, 0x0f, 0, 0) // 983,040 bytes to come
	writeAll(t, peer, forged)
	if _, err := z.next(); !errors.Is(err, refused) {
		t.Fatalf("a refused topic: %v", err)
	}

	z, peer = connPair(t, 1<<20)
	z.onTopic = check
	shown = nil
	writeAll(t, peer, []byte{zmtpMore | zmtpLong, 0, 0, 0, 0, 0, 0, 4, 1}) // a topic of 1,025 bytes
	if _, err := z.next(); !errors.Is(err, errZMTP) || !strings.Contains(err.Error(), "topic of 1025") {
		t.Fatalf("a long topic: %v", err)
	}
	if len(shown) != 0 {
		t.Fatalf("a long topic was shown: %q", shown)
	}
}

// TestZMTPConnGrowsWithWhatComes: a frame that announces 1 MiB is not
// allocated from its header: the buffer grows, doubling, only as its
// bytes come, and no further than one message's bound.
func TestZMTPConnGrowsWithWhatComes(t *testing.T) {
	z, peer := connPair(t, 1<<20)
	header := zmtpFrame(zmtpLong, nil, true)
	binary.BigEndian.PutUint64(header[1:], 1<<20-9)
	writeAll(t, peer, append(header, make([]byte, 100)...))
	if _, err := z.next(); !isAgain(err) {
		t.Fatalf("a frame begun: %v", err)
	}
	if len(z.buf) != zmtpBufStart {
		t.Fatalf("the buffer is %d bytes after 109 came, want %d", len(z.buf), zmtpBufStart)
	}
	writeAll(t, peer, make([]byte, 20<<10))
	if _, err := z.next(); !isAgain(err) {
		t.Fatalf("a frame begun: %v", err)
	}
	if len(z.buf) != 2*zmtpBufStart {
		t.Fatalf("the buffer is %d bytes after 20 KiB more came, want %d", len(z.buf), 2*zmtpBufStart)
	}

	// Doubling stops at what one message can take: with a bound of
	// 40,000 bytes, a 39,000-byte frame grows the buffer from 32 KiB to
	// that room, not to 64 KiB.
	const bound = 40_000
	z, peer = connPair(t, bound)
	binary.BigEndian.PutUint64(header[1:], 39_000)
	writeAll(t, peer, append(header, make([]byte, 35<<10)...))
	if _, err := z.next(); !isAgain(err) {
		t.Fatalf("a frame begun: %v", err)
	}
	if want := bound + liveFrameCount*9; len(z.buf) != want {
		t.Fatalf("the buffer is %d bytes with a %d-byte bound, want %d", len(z.buf), bound, want)
	}
	writeAll(t, peer, make([]byte, 39_000-35<<10))
	if frames, err := z.next(); err != nil || len(frames) != 1 || len(frames[0]) != 39_000 {
		t.Fatalf("the whole frame: %d frames, %v", len(frames), err)
	}
}

// handshakePeer plays a publisher's side of the handshake on a pipe:
// it reads the subscriber's greeting and READY, sends greeting and
// command, and, when the handshake went on, returns the subscription.
func handshakePeer(t *testing.T, greeting, command []byte) ([]byte, error) {
	t.Helper()
	sub, pub := net.Pipe()
	defer sub.Close()
	got := make(chan []byte, 1)
	go func() {
		defer pub.Close()
		_ = pub.SetDeadline(time.Now().Add(5 * time.Second))
		in := make([]byte, zmtpGreeting+len(readyCommand("SUB")))
		if _, err := io.ReadFull(pub, in); err != nil {
			got <- nil
			return
		}
		_, _ = pub.Write(append(append([]byte(nil), greeting...), command...))
		sub := make([]byte, 3)
		if _, err := io.ReadFull(pub, sub); err != nil {
			got <- nil
			return
		}
		got <- sub
	}()
	_ = sub.SetDeadline(time.Now().Add(5 * time.Second))
	err := subHandshake(sub)
	if err != nil {
		sub.Close()
	}
	return <-got, err
}

// TestSubHandshake: a PUB's or an XPUB's greeting and READY (with more
// properties, in another case) get the subscription to every topic; a
// greeting of another revision or mechanism, a first command other than
// READY, a peer of another socket type and an oversized READY are
// refused.
func TestSubHandshake(t *testing.T) {
	ready := func(typ string, more ...string) []byte {
		body := append([]byte{5}, "READY"...)
		for i := 0; i+1 < len(more); i += 2 {
			body = append(append(body, byte(len(more[i]))), more[i]...)
			body = binary.BigEndian.AppendUint32(body, uint32(len(more[i+1])))
			body = append(body, more[i+1]...)
		}
		body = append(append(body, 11), "socket-type"...)
		body = binary.BigEndian.AppendUint32(body, uint32(len(typ)))
		return zmtpFrame(zmtpCommand, append(body, typ...), false)
	}
	good := zmtpGreetingFor(3, "NULL")
	for _, typ := range []string{"PUB", "XPUB"} {
		sub, err := handshakePeer(t, good, ready(typ, "Identity", "engine-0"))
		if err != nil || !bytes.Equal(sub, []byte{0, 1, 1}) {
			t.Fatalf("%s: %v, subscription % x", typ, err, sub)
		}
	}
	for _, c := range []struct {
		name, want        string
		greeting, command []byte
	}{
		{"ZMTP 2.0", "revision 1", zmtpGreetingFor(1, "NULL"), ready("PUB")},
		{"CURVE", "not NULL", zmtpGreetingFor(3, "CURVE"), ready("PUB")},
		{"not ZMTP 3", "not a ZMTP 3 greeting", make([]byte, zmtpGreeting), ready("PUB")},
		{"a ROUTER", "not one of [PUB XPUB]", good, ready("ROUTER")},
		{"no socket type", "not one of [PUB XPUB]", good, zmtpFrame(zmtpCommand, []byte("\x05READY"), false)},
		{"a PING first", "not READY", good, zmtpFrame(zmtpCommand, []byte("\x04PING\x00\x00"), false)},
		{"a message first", "where READY was due", good, zmtpFrame(0, []byte("x"), false)},
		{"a huge READY", "a READY of", good, zmtpFrame(zmtpCommand, make([]byte, maxReadyBytes+1), false)},
	} {
		_, err := handshakePeer(t, c.greeting, c.command)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// readAll writes stream to a fresh connection in two pieces, split at
// split, and takes every message, until the connection breaks or the
// stream is all taken; it returns the messages and whether the stream
// broke it.
func readAll(t *testing.T, stream []byte, split int, pinned bool) (msgs []string, broke bool, shown []string) {
	z, peer := connPair(t, 1024)
	if pinned {
		// As topicGuard does: the first topic is let through, and every
		// later one must be the same.
		var first []byte
		z.onTopic = func(topic []byte) error {
			shown = append(shown, string(topic))
			if first == nil {
				first = bytes.Clone(topic)
			}
			if !bytes.Equal(topic, first) {
				return errTopic
			}
			return nil
		}
	}
	for _, piece := range [][]byte{stream[:split], stream[split:]} {
		writeAll(t, peer, piece)
		for {
			frames, err := z.next()
			if isAgain(err) {
				break
			}
			if err != nil {
				return msgs, true, shown
			}
			msgs = append(msgs, string(bytes.Join(frames, []byte{0xff})))
		}
	}
	return msgs, false, shown
}

// FuzzZMTPConn: whatever a publisher sends, the native reader does not
// panic, and the messages it takes, whether it breaks the connection and,
// with a topic check (bind mode), the topics it shows (each message's
// once) do not depend on how the stream is split into reads.
func FuzzZMTPConn(f *testing.F) {
	good := zmtpMessage([]byte("kv@5@m"), make([]byte, 8), bytes.Repeat([]byte{1}, 300))
	f.Add(good, uint16(70))
	f.Add(append(zmtpFrame(zmtpCommand, []byte("\x04PING\x00\x10ab"), false), good...), uint16(5))
	f.Add(append(good, zmtpMessage(nil, nil, nil, nil)...), uint16(3))
	f.Add(append(good, zmtpMessage([]byte("kv@6@m"), make([]byte, 8), nil)...), uint16(320))
	f.Fuzz(func(t *testing.T, stream []byte, at uint16) {
		if len(stream) > 64<<10 {
			return // past a socket pair's buffer, a write would wait for a reader
		}
		split := int(at) % (len(stream) + 1)
		for _, pinned := range []bool{false, true} {
			whole, wholeBroke, wholeShown := readAll(t, stream, len(stream), pinned)
			pieces, piecesBroke, piecesShown := readAll(t, stream, split, pinned)
			if wholeBroke != piecesBroke || !slices.Equal(whole, pieces) || !slices.Equal(wholeShown, piecesShown) {
				t.Fatalf("checked %v; whole: %d messages, broke %v, %d topics shown; split at %d: %d, broke %v, %d shown",
					pinned, len(whole), wholeBroke, len(wholeShown), split, len(pieces), piecesBroke, len(piecesShown))
			}
		}
	})
}

// TestDialTargets: which endpoints the native subscriber dials, and how.
func TestDialTargets(t *testing.T) {
	for _, c := range []struct {
		endpoint, network, addr, local string // local "" for none
		ok                             bool
	}{
		{"tcp://10.0.0.11:5557", "tcp", "10.0.0.11:5557", "", true},
		{"tcp://[::1]:5557", "tcp", "[::1]:5557", "", true},
		{"tcp://worker-3.fleet:5557", "tcp", "worker-3.fleet:5557", "", true},
		{"tcp://10.0.0.1:0;10.0.0.11:5557", "tcp", "10.0.0.11:5557", "10.0.0.1:0", true},
		{"tcp://10.0.0.1:*;10.0.0.11:5557", "tcp", "10.0.0.11:5557", "10.0.0.1:0", true},
		{"ipc:///run/vllm/kv.sock", "unix", "/run/vllm/kv.sock", "", true},
		{"tcp://eth0:0;10.0.0.11:5557", "", "", "", false}, // an interface: libzmq's
		{"tcp://no port here", "", "", "", false},
		{"tcp://10.0.0.11:99999", "", "", "", false},
		{"ipc://", "", "", "", false},
		{"inproc://events", "", "", "", false},
	} {
		got, ok := dialTargetOf(c.endpoint)
		if ok != c.ok {
			t.Errorf("%s: ok %v, want %v", c.endpoint, ok, c.ok)
			continue
		}
		if !ok {
			continue
		}
		local := ""
		if got.local != nil {
			local = got.local.String()
		}
		if got.network != c.network || got.addr != c.addr || local != c.local {
			t.Errorf("%s: %s %s from %q, want %s %s from %q", c.endpoint, got.network, got.addr, local, c.network, c.addr, c.local)
		}
	}
}

// TestZMTPConnCutsACommandFlood: commands between messages are allowed a
// burst of commandBurst, then commandRate a second. A publisher that
// keeps the socket full of PINGs, and never sends a message, is cut at
// once rather than keeping next (and the ingest loop that calls it)
// answering PONGs for as long as it goes on; one that PINGs within its
// allowance still gets each answered, and its messages read.
func TestZMTPConnCutsACommandFlood(t *testing.T) {
	ping := zmtpFrame(zmtpCommand, []byte("\x04PING\x00\x00ctx"), false)
	one := append(append(zmtpFrame(zmtpMore, []byte("kv@5@m"), false), zmtpFrame(zmtpMore, make([]byte, 8), false)...), zmtpFrame(0, []byte("p"), false)...)

	z, peer := connPair(t, 1<<20)
	writeAll(t, peer, append(bytes.Repeat(ping, commandBurst), one...))
	if frames, err := z.next(); err != nil || len(frames) != 3 {
		t.Fatalf("a burst of %d PINGs, then a message: %d frames, %v", commandBurst, len(frames), err)
	}
	pongs := make([]byte, 64<<10)
	n, _ := syscall.Read(peer, pongs)
	if want := commandBurst * len(zmtpFrame(zmtpCommand, []byte("\x04PONGctx"), false)); n != want {
		t.Errorf("%d bytes of PONGs, want %d", n, want)
	}

	z, peer = connPair(t, 1<<20)
	writeAll(t, peer, bytes.Repeat(ping, 4*commandBurst))
	if _, err := z.next(); !errors.Is(err, errZMTP) || !strings.Contains(err.Error(), "commands faster") {
		t.Fatalf("a flood of PINGs: %v, want a cut", err)
	}

	// Inside messages (at most 16 each), a stream of small messages would
	// otherwise multiply them without bound: they count too.
	within := append(append(append(zmtpFrame(zmtpMore, []byte("kv@5@m"), false), bytes.Repeat(ping, 16)...),
		zmtpFrame(zmtpMore, make([]byte, 8), false)...), zmtpFrame(0, []byte("p"), false)...)
	z, peer = connPair(t, 1<<20)
	writeAll(t, peer, bytes.Repeat(within, 16))
	var err error
	for n := 0; err == nil; n++ {
		if _, err = z.next(); err == nil && n >= commandBurst/16 {
			t.Fatalf("message %d with 16 PINGs inside was read", n)
		}
	}
	if !errors.Is(err, errZMTP) || !strings.Contains(err.Error(), "commands faster") {
		t.Fatalf("PINGs inside messages: %v, want a cut", err)
	}
}
