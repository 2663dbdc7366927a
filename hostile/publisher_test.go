package hostile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvrouter/caddy-kvrouter/indexer"
)

// KV-event publishers as vLLM runs them: a ZMQ PUB socket bound on
// loopback, each message three frames [topic, 8-byte big-endian sequence,
// msgpack payload], payloads written by the project's own encoder
// (indexer.AppendBatch) so that they are exactly what the gateway decodes
// from real workers.

var zctx struct {
	once sync.Once
	ctx  *zmq.Context
	err  error
}

// zmqContext is the test process's one ZMQ context. It is never
// terminated: Term waits for every socket, and a socket a failed test left
// open would hang the run; the process's exit frees it.
func zmqContext(t *testing.T) *zmq.Context {
	t.Helper()
	zctx.once.Do(func() { zctx.ctx, zctx.err = zmq.NewContext() })
	if zctx.err != nil {
		t.Fatal(zctx.err)
	}
	return zctx.ctx
}

// publisher is an XPUB socket (a PUB that also reports subscriptions, so
// the test knows when the gateway listens) with its own sequence.
type publisher struct {
	mu   sync.Mutex
	sock *zmq.Socket
	ep   string // tcp://127.0.0.1:port
	seq  uint64
	once sync.Once
}

// newPublisher binds a publisher; sndHWM bounds the messages it queues for
// a slow subscriber (0: no bound, for floods that must arrive whole).
func newPublisher(t *testing.T, sndHWM int) *publisher {
	t.Helper()
	s, err := zmqContext(t).NewSocket(zmq.XPUB)
	if err != nil {
		t.Fatal(err)
	}
	p := &publisher{sock: s}
	for _, err := range []error{s.SetLinger(0), s.SetXpubVerbose(1), s.SetSndhwm(sndHWM),
		s.SetRcvtimeo(100 * time.Millisecond), s.Bind("tcp://127.0.0.1:*")} {
		if err != nil {
			s.Close()
			t.Fatal(err)
		}
	}
	p.ep, _ = s.GetLastEndpoint()
	t.Cleanup(p.close)
	return p
}

func (p *publisher) close() {
	p.once.Do(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.sock.Close()
	})
}

// waitSubscribed waits until a subscriber (the gateway's listener) has
// subscribed; messages sent before that are lost, as with any PUB.
func (p *publisher) waitSubscribed(d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		f, err := p.sock.RecvBytes(0)
		p.mu.Unlock()
		if err == nil && len(f) > 0 && f[0] == 1 {
			return nil
		}
	}
	return errors.New("the gateway never subscribed to " + p.ep)
}

// sendSeq publishes one payload under sequence seq.
func (p *publisher) sendSeq(seq uint64, payload []byte) error {
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := p.sock.SendMessage([]byte{}, s[:], payload)
	return err
}

// send publishes one payload under the next sequence.
func (p *publisher) send(payload []byte) error {
	p.mu.Lock()
	seq := p.seq
	p.seq++
	p.mu.Unlock()
	return p.sendSeq(seq, payload)
}

// batch encodes events as one payload in vLLM's current (map) encoding;
// dpRank -1 leaves the payload's rank out.
func batch(dpRank int, events ...any) []byte {
	return indexer.AppendBatch(nil, indexer.EncodingMap, float64(time.Now().UnixNano())/1e9, dpRank, events...)
}

// stored is a BlockStored of the full blocks of toks, under engine block
// hashes base+1, base+2, … (engines' hashes are opaque; unique is enough).
func stored(base uint64, toks []uint32) *indexer.StoredBlocks {
	n := len(toks) / blockSize
	ev := &indexer.StoredBlocks{BlockSize: blockSize, TokenIDs: toks[:n*blockSize]}
	for i := range n {
		ev.BlockHashes = append(ev.BlockHashes, base+uint64(i)+1)
	}
	return ev
}

// dialer is a PUB that dials the gateway's bound KV-event endpoint from
// source address src, as an engine whose publisher connects does, and
// publishes under topic (kv@<worker_id>@<model> in bind mode).
type dialer struct {
	sock  *zmq.Socket
	topic string
	seq   uint64
}

func newDialer(t *testing.T, src string, port int, topic string) *dialer {
	t.Helper()
	s, err := zmqContext(t).NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	for _, err := range []error{s.SetLinger(0), s.SetReconnectIvl(50 * time.Millisecond),
		s.Connect(fmt.Sprintf("tcp://%s:0;127.0.0.1:%d", src, port))} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return &dialer{sock: s, topic: topic}
}

// send publishes one payload under the next sequence; a PUB drops it
// while it is not connected and subscribed.
func (d *dialer) send(payload []byte) error {
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], d.seq)
	d.seq++
	_, err := d.sock.SendMessage(d.topic, s[:], payload)
	return err
}
