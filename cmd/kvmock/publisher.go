package main

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	zmq "github.com/pebbe/zmq4"
)

// The KV-event publishers of the whole fleet. vLLM has one publisher
// thread per engine; here one goroutine (the sender) owns every PUB socket
// and another (the replay server, replay.go) owns every replay ROUTER.
// With a thousand workers that is two goroutines instead of two thousand,
// and neither wakes up while the fleet is idle: the sender blocks on a Go
// channel, the replay server in zmq_poll without a timeout. The two talk
// over an inproc PUSH/PULL pair, because a goroutine blocked in zmq_poll
// can only be woken by a socket.

// rankPub is the publishing state of one engine (one DP rank of a worker):
// its sequence counter and replay buffer, shared by the sender (which
// appends) and the replay server (which reads).
type rankPub struct {
	idx    int // position in the fleet's socket tables
	worker int // worker id, 1-based
	dpRank int

	// PubEndpoint and ReplayEndpoint are the bound endpoints, known once
	// the fleet has started.
	PubEndpoint, ReplayEndpoint string

	mu  sync.Mutex
	seq uint64 // next sequence number
	buf ring
	// drop is how many of the next batches are buffered but not sent.
	drop int

	batches atomic.Int64 // batches sent on the PUB socket
	dropped atomic.Int64 // batches held back by drop_events
	events  atomic.Int64 // events in all batches, sent or not
	// subs is how many distinct topics subscribers hold on the PUB socket,
	// as of the last refresh (publisher.refreshSubs); 0 means nobody would
	// receive a batch published now.
	subs atomic.Int64
}

// ring keeps the last limit batches, oldest first from head. It grows as
// batches arrive rather than up front: a thousand idle workers with room for
// 10,000 batches each would otherwise hold 300 MB of empty slots.
type ring struct {
	items []batch
	head  int
	limit int
}

// batch is one published message: its sequence number and payload. The
// payload is never modified after publishing, so replays share it.
type batch struct {
	seq     uint64
	payload []byte
}

// push adds a batch, overwriting the oldest once the ring is full.
func (r *ring) push(b batch) {
	if len(r.items) < r.limit {
		r.items = append(r.items, b)
		return
	}
	r.items[r.head] = b
	r.head = (r.head + 1) % len(r.items)
}

// from returns the buffered batches with seq >= start, oldest first.
func (r *ring) from(start uint64) []batch {
	var out []batch
	for i := range len(r.items) {
		if b := r.items[(r.head+i)%len(r.items)]; b.seq >= start {
			out = append(out, b)
		}
	}
	return out
}

// reset empties the ring and lets go of its memory, as a new process would.
func (r *ring) reset() {
	r.items, r.head = nil, 0
}

// opKind is what an engine asks of the sender.
type opKind uint8

// The sender's operations.
const (
	// opPublish sends a payload under the rank's next sequence number.
	opPublish opKind = iota
	// opRestart resets the sequence to 0 and empties the replay buffer,
	// like a new vLLM process. It travels the same channel as publishes, so
	// every batch of the old "process" is out before the counter restarts.
	opRestart
	// opClose closes the rank's PUB and ROUTER sockets for good.
	opClose
	// opSubs reads the subscriptions every PUB socket has received into
	// the ranks' subs counters, then closes done.
	opSubs
)

// pubOp is one request to the sender.
type pubOp struct {
	kind    opKind
	rank    *rankPub
	payload []byte
	events  int
	done    chan struct{} // opSubs
}

// publisher owns the ZMQ side of the fleet.
type publisher struct {
	zctx  *zmq.Context
	ranks []*rankPub
	ops   chan pubOp
	ctl   string // inproc endpoint from the sender to the replay server

	senderDone, replayDone chan struct{}
}

// Control messages from the sender to the replay server.
const (
	ctlQuit  = "quit"
	ctlClose = "close" // followed by a frame with the rank index
)

// startPublisher binds every rank's sockets, on the ports Config numbers
// (any free port for a zero base), and starts the two goroutines.
func startPublisher(zctx *zmq.Context, ranks []*rankPub, cfg *Config) (*publisher, error) {
	p := &publisher{
		zctx:       zctx,
		ranks:      ranks,
		ops:        make(chan pubOp, 1024),
		ctl:        fmt.Sprintf("inproc://kvmock-ctl-%p", ranks),
		senderDone: make(chan struct{}),
		replayDone: make(chan struct{}),
	}
	for _, r := range ranks {
		r.buf.limit = cfg.ReplayBuffer
	}
	// The replay server binds the inproc endpoint before the sender
	// connects to it.
	ready := make(chan error)
	go p.serveReplay(cfg, ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	go p.send(cfg, ready)
	if err := <-ready; err != nil {
		<-p.replayDone
		return nil, err
	}
	return p, nil
}

// publish queues a payload of n events for rank r.
func (p *publisher) publish(r *rankPub, payload []byte, n int) {
	p.ops <- pubOp{kind: opPublish, rank: r, payload: payload, events: n}
}

// restart queues a sequence reset for rank r.
func (p *publisher) restart(r *rankPub) { p.ops <- pubOp{kind: opRestart, rank: r} }

// closeRank queues the closing of rank r's sockets.
func (p *publisher) closeRank(r *rankPub) { p.ops <- pubOp{kind: opClose, rank: r} }

// refreshSubs brings every rank's subs counter up to date and returns
// once it is. A benchmark waits on it before loading the fleet: a PUB
// drops what it publishes before a subscription reaches it (ZMQ's slow
// joiner), and the gateway would see those batches as a gap.
func (p *publisher) refreshSubs() {
	done := make(chan struct{})
	p.ops <- pubOp{kind: opSubs, done: done}
	<-done
}

// close stops both goroutines, which close every socket. No engine may
// publish afterwards.
func (p *publisher) close() {
	close(p.ops)
	<-p.senderDone
	<-p.replayDone
}

// send is the sender goroutine. It creates, uses and closes every PUB
// socket and the control PUSH socket.
func (p *publisher) send(cfg *Config, ready chan<- error) {
	defer close(p.senderDone)
	// libzmq sockets may move between threads only with a memory barrier;
	// pinning the goroutine avoids the question.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	ctl, err := p.zctx.NewSocket(zmq.PUSH)
	if err == nil {
		err = ctl.Connect(p.ctl)
	}
	if err != nil {
		// Without a control socket the replay server cannot be told to
		// stop; this happens only if the context is broken.
		ready <- fmt.Errorf("control socket: %w", err)
		return
	}
	defer ctl.Close()
	_ = ctl.SetLinger(-1) // the quit message must arrive

	socks := make([]*zmq.Socket, len(p.ranks))
	defer func() {
		for _, s := range socks {
			if s != nil {
				s.Close()
			}
		}
		_, _ = ctl.Send(ctlQuit, 0)
	}()
	for i, r := range p.ranks {
		// An XPUB is a PUB that also hands over the subscriptions it
		// receives, so the fleet can tell when the gateway listens. On the
		// wire a SUB sees no difference from vLLM's PUB.
		s, err := p.zctx.NewSocket(zmq.XPUB)
		if err != nil {
			ready <- err
			return
		}
		socks[i] = s
		// vLLM's defaults: a deep send queue, and no lingering on close.
		_ = s.SetSndhwm(100_000)
		_ = s.SetLinger(0)
		ep := cfg.zmqEndpoint(cfg.ZMQBasePort, r.worker-1, r.dpRank)
		if err := s.Bind(ep); err != nil {
			ready <- fmt.Errorf("worker %d rank %d: bind KV events %s: %w", r.worker, r.dpRank, ep, err)
			return
		}
		r.PubEndpoint, _ = s.GetLastEndpoint()
	}
	ready <- nil

	var seq8 [8]byte
	empty := []byte{}
	for op := range p.ops {
		if op.kind == opSubs {
			for i, s := range socks {
				if s != nil {
					countSubs(s, p.ranks[i])
				}
			}
			close(op.done)
			continue
		}
		r := op.rank
		s := socks[r.idx]
		switch op.kind {
		case opPublish:
			r.mu.Lock()
			seq := r.seq
			r.seq++
			r.buf.push(batch{seq, op.payload})
			hold := r.drop > 0
			if hold {
				r.drop--
			}
			r.mu.Unlock()
			r.events.Add(int64(op.events))
			if hold || s == nil {
				r.dropped.Add(1)
				continue
			}
			binary.BigEndian.PutUint64(seq8[:], seq)
			// PUB never blocks: at the high-water mark it drops, as vLLM's does.
			if _, err := s.SendMessage(empty, seq8[:], op.payload); err == nil {
				r.batches.Add(1)
			}
		case opRestart:
			r.mu.Lock()
			r.seq, r.drop = 0, 0
			r.buf.reset()
			r.mu.Unlock()
		case opClose:
			if s != nil {
				s.Close()
				socks[r.idx] = nil
			}
			r.subs.Store(0)
			var idx [8]byte
			binary.BigEndian.PutUint64(idx[:], uint64(r.idx))
			_, _ = ctl.SendMessage(ctlClose, idx[:])
		}
	}
}

// countSubs takes the subscription messages waiting on an XPUB socket.
// Without XPUB_VERBOSE, libzmq passes a topic's first subscription and, when
// its last subscriber unsubscribes or goes away, one unsubscription, so the
// running sum is the number of topics somebody holds.
func countSubs(s *zmq.Socket, r *rankPub) {
	for {
		msg, err := s.RecvBytes(zmq.DONTWAIT)
		if err != nil {
			return
		}
		switch {
		case len(msg) > 0 && msg[0] == 1:
			r.subs.Add(1)
		case len(msg) > 0 && msg[0] == 0:
			r.subs.Add(-1)
		}
	}
}

// dropNext makes the next n batches of r buffered for replay but not
// sent, simulating their loss on the way.
func (r *rankPub) dropNext(n int) {
	r.mu.Lock()
	r.drop = n
	r.mu.Unlock()
}

// nextSeq is the sequence number the next batch will get.
func (r *rankPub) nextSeq() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seq
}
