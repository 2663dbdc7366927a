package indexer

import (
	"encoding/binary"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// testPublisher is a vLLM-like KV-event publisher on real sockets: an XPUB
// (a PUB that also reports subscriptions, so tests can wait for the
// listener) and a ROUTER replay endpoint with a 10,000-batch buffer.
type testPublisher struct {
	t      *testing.T
	pub    *zmq.Socket
	pubEP  string
	replay string

	mu        sync.Mutex
	seq       uint64
	buf       []buffered
	topicRepl bool // reply in vLLM ≥ 0.26's 4-frame form
	silent    bool // never answer replay requests

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type buffered struct {
	seq     uint64
	payload []byte
}

const replayBuffer = 10_000

func newTestPublisher(t *testing.T, zctx *zmq.Context, withReplay bool) *testPublisher {
	t.Helper()
	return newTestPublisherOn(t, zctx, withReplay, "127.0.0.1")
}

// newTestPublisherOn is a publisher bound on host ("[::1]" for IPv6).
func newTestPublisherOn(t *testing.T, zctx *zmq.Context, withReplay bool, host string) *testPublisher {
	t.Helper()
	p := &testPublisher{t: t, stop: make(chan struct{}), done: make(chan struct{})}
	var err error
	if p.pub, err = zctx.NewSocket(zmq.XPUB); err != nil {
		t.Fatal(err)
	}
	_ = p.pub.SetLinger(0)
	_ = p.pub.SetSndhwm(1_000_000)
	_ = p.pub.SetXpubVerbose(1) // report every subscription, not only the first
	_ = p.pub.SetIpv6(true)
	if err := p.pub.Bind("tcp://" + host + ":*"); err != nil {
		t.Fatal(err)
	}
	p.pubEP, _ = p.pub.GetLastEndpoint()
	var router *zmq.Socket
	if withReplay {
		if router, err = zctx.NewSocket(zmq.ROUTER); err != nil {
			t.Fatal(err)
		}
		_ = router.SetLinger(0)
		_ = router.SetIpv6(true)
		if err := router.Bind("tcp://" + host + ":*"); err != nil {
			t.Fatal(err)
		}
		p.replay, _ = router.GetLastEndpoint()
	}
	go p.serve(router)
	t.Cleanup(p.close)
	return p
}

// serve answers replay requests until close; it owns the ROUTER.
func (p *testPublisher) serve(router *zmq.Socket) {
	defer close(p.done)
	if router == nil {
		<-p.stop
		return
	}
	defer router.Close()
	_ = router.SetRcvtimeo(20 * time.Millisecond)
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		f, err := router.RecvMessageBytes(0)
		if err != nil || len(f) != 3 || len(f[1]) != 0 || len(f[2]) != 8 {
			continue
		}
		start := binary.BigEndian.Uint64(f[2])
		p.mu.Lock()
		silent, topic := p.silent, p.topicRepl
		var out []buffered
		for _, b := range p.buf {
			if b.seq >= start {
				out = append(out, b)
			}
		}
		p.mu.Unlock()
		if silent {
			continue
		}
		for _, b := range out {
			var s [8]byte
			binary.BigEndian.PutUint64(s[:], b.seq)
			if topic {
				_, _ = router.SendMessage(f[0], []byte{}, []byte("kv"), s[:], b.payload)
			} else {
				_, _ = router.SendMessage(f[0], []byte{}, s[:], b.payload)
			}
		}
		end := [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
		_, _ = router.SendMessage(f[0], []byte{}, end[:], []byte{})
	}
}

func (p *testPublisher) close() {
	p.closeOnce.Do(func() {
		close(p.stop)
		<-p.done
		p.pub.Close()
	})
}

// waitSubscribed blocks until a subscriber has subscribed.
func (p *testPublisher) waitSubscribed() {
	p.t.Helper()
	_ = p.pub.SetRcvtimeo(5 * time.Second)
	if f, err := p.pub.RecvBytes(0); err != nil || len(f) == 0 || f[0] != 1 {
		p.t.Fatalf("no subscription: %v", err)
	}
}

// waitResubscribed blocks until a subscriber has subscribed, skipping the
// unsubscriptions of subscribers that went away (a replaced listener, a
// dropped connection).
func (p *testPublisher) waitResubscribed() {
	p.t.Helper()
	_ = p.pub.SetRcvtimeo(10 * time.Second)
	for {
		f, err := p.pub.RecvBytes(0)
		if err != nil {
			p.t.Fatalf("no new subscription: %v", err)
		}
		if len(f) > 0 && f[0] == 1 {
			return
		}
	}
}

// publish sends a payload under the next sequence number and buffers it.
// With send false the message is buffered but never sent: a loss.
func (p *testPublisher) publish(payload []byte, send bool) uint64 {
	p.t.Helper()
	p.mu.Lock()
	seq := p.seq
	p.seq++
	p.buf = append(p.buf, buffered{seq, payload})
	if len(p.buf) > replayBuffer {
		p.buf = p.buf[len(p.buf)-replayBuffer:]
	}
	p.mu.Unlock()
	if send {
		var s [8]byte
		binary.BigEndian.PutUint64(s[:], seq)
		if _, err := p.pub.SendMessage([]byte{}, s[:], payload); err != nil {
			p.t.Fatal(err)
		}
	}
	return seq
}

// raw sends frames as they are, for malformed-message tests.
func (p *testPublisher) raw(frames ...[]byte) {
	parts := make([]any, len(frames))
	for i, f := range frames {
		parts[i] = f
	}
	if _, err := p.pub.SendMessage(parts...); err != nil {
		p.t.Fatal(err)
	}
}

// jumpTo makes seq the next sequence number, as a publisher whose
// numbering leaps does.
func (p *testPublisher) jumpTo(seq uint64) {
	p.mu.Lock()
	p.seq = seq
	p.mu.Unlock()
}

// restart resets the sequence to 0 and forgets the buffer, as a new
// engine process does.
func (p *testPublisher) restart() {
	p.mu.Lock()
	p.seq, p.buf = 0, nil
	p.mu.Unlock()
}

// eventually waits for cond, failing after a generous timeout. It checks
// correctness, not speed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
