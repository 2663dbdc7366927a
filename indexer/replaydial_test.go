package indexer

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// hostileRouter serves one replay exchange on a loopback port: it greets
// as a ROUTER, reads the DEALER's greeting, READY and request, then
// writes reply (until the connection breaks) and keeps the connection
// open. It returns the endpoint to dial and the request it read.
func hostileRouter(t *testing.T, reply func(w io.Writer)) (dialTarget, <-chan []byte) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	asked := make(chan []byte, 1)
	done := make(chan struct{})
	t.Cleanup(func() { <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write(append(zmtpGreetingFor(3, "NULL"), readyCommand("ROUTER")...))
		in := make([]byte, zmtpGreeting+len(readyCommand("DEALER"))+12)
		if _, err := io.ReadFull(c, in); err != nil {
			return
		}
		asked <- in[len(in)-12:]
		reply(c)
	}()
	return dialTarget{network: "tcp", addr: ln.Addr().String()}, asked
}

// TestReplayRepliesBounded: a replay reply read by the gateway's own
// DEALER is cut at the header of the frame that breaks a bound, whatever
// the publisher goes on sending: a fifth frame, a frame past the reply's
// byte bound (frames of 512 KiB with more set, without end), commands
// without end; a publisher that sends nothing ends at the exchange's
// deadline. An honest reply, with vLLM's topic frame or without, reads
// whole, and the request asked for the sequence given.
func TestReplayRepliesBounded(t *testing.T) {
	const bound = 1 << 20
	seq := func(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }
	honest := zmtpMessage([]byte{}, []byte("kv@1@m"), seq(7), []byte("payload"))
	cases := []struct {
		name  string
		reply func(w io.Writer)
		want  string // in the error; "" for the honest reply
	}{
		{"honest, then another", func(w io.Writer) {
			w.Write(append(honest, zmtpMessage([]byte{}, seq(8), []byte("p"))...))
		}, ""},
		{"a fifth frame", func(w io.Writer) {
			w.Write(bytes.Repeat(zmtpFrame(zmtpMore, nil, false), 5))
		}, "more than 4 frames"},
		{"512 KiB frames without end", func(w io.Writer) {
			frame := zmtpFrame(zmtpMore, make([]byte, 512<<10), false)
			for range 1 << 12 {
				if _, err := w.Write(frame); err != nil {
					return
				}
			}
		}, "more than 1048576 bytes"},
		{"commands without end", func(w io.Writer) {
			ping := zmtpFrame(zmtpCommand, []byte("\x04PING\x00\x00"), false)
			for range 1 << 12 {
				if _, err := w.Write(ping); err != nil {
					return
				}
			}
		}, "commands in one replay"},
		{"nothing", func(w io.Writer) { time.Sleep(time.Second) }, "i/o timeout"},
	}
	for _, c := range cases {
		target, asked := hostileRouter(t, c.reply)
		deadline := time.Now().Add(500 * time.Millisecond)
		rc, err := dialReplay(context.Background(), target, 7, bound, deadline)
		if err != nil {
			t.Fatalf("%s: dial: %v", c.name, err)
		}
		if got := <-asked; !bytes.Equal(got, append([]byte{zmtpMore, 0, 0, 8}, seq(7)...)) {
			t.Errorf("%s: the request was %x", c.name, got)
		}
		frames, err := rc.next()
		switch {
		case c.want == "":
			if err != nil || len(frames) != 4 || string(frames[3]) != "payload" {
				t.Errorf("%s: %q, %v", c.name, frames, err)
			}
			if frames, err = rc.next(); err != nil || len(frames) != 3 || string(frames[2]) != "p" {
				t.Errorf("%s, the second: %q, %v", c.name, frames, err)
			}
		case err == nil || !strings.Contains(err.Error(), c.want):
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		case errors.Is(err, errZMTP) && cap(rc.buf) > bound:
			t.Errorf("%s: the reader grew to %d bytes, past the bound", c.name, cap(rc.buf))
		}
		rc.close()
	}
}

// TestReplayCountsWhatItGot: a reply whose payload is malformed is
// counted malformed and not replayed (its events are lost with the rest of
// the gap); a reply past the bounds ends the exchange and is counted in
// cut. Both used to count only in the log's "replay incomplete".
func TestReplayCountsWhatItGot(t *testing.T) {
	seq := func(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }
	good := AppendBatch(nil, EncodingArray, 1, 0, &StoredBlocks{BlockHashes: []uint64{1}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4})
	target, _ := hostileRouter(t, func(w io.Writer) {
		w.Write(zmtpMessage([]byte{}, seq(3), good))
		w.Write(zmtpMessage([]byte{}, seq(4), []byte("not msgpack")))
		w.Write(bytes.Repeat(zmtpFrame(zmtpMore, nil, false), 5))
	})
	x := New()
	x.ConfigurePartition(part, 4, false)
	stats := &Stats{}
	l := &stream{cfg: ListenerConfig{Replay: "tcp://" + target.addr, Partition: part, Rank: selectionRank(1), ReplayTimeout: 2 * time.Second},
		index: x, stats: stats, log: zap.NewNop(), stop: make(chan struct{}), turn: &ingestTurn{x: x}}
	var dec Decoder
	last, got, err := l.replay(&dec, 3, 9)
	if !errors.Is(err, errZMTP) || last != 4 || got != 1 {
		t.Fatalf("replay: last %d, got %d, %v; want 4, 1 and a cut", last, got, err)
	}
	if stats.Replayed.Load() != 1 || stats.Malformed.Load() != 1 || stats.Cut.Load() != 1 {
		t.Fatalf("replayed %d, malformed %d, cut %d; want 1 each", stats.Replayed.Load(), stats.Malformed.Load(), stats.Cut.Load())
	}
}
