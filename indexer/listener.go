package indexer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// The ZMQ side (spec kv-events.md §1.3–1.4): a SUB per publisher, 3-frame
// messages [topic, seq (8 bytes, big-endian), payload], sequence tracking,
// and replay of gaps over a DEALER dialed for that gap only.

// Stats counts what listeners saw; all fields are safe to read at any time.
type Stats struct {
	Messages  atomic.Uint64 // well-framed messages received live
	Batches   atomic.Uint64 // payloads applied (live or replayed)
	Malformed atomic.Uint64 // frames or payloads that could not be used
	Stale     atomic.Uint64 // duplicates of already applied sequences
	Gaps      atomic.Uint64 // sequence jumps seen
	Replays   atomic.Uint64 // replay requests made
	Replayed  atomic.Uint64 // batches recovered by replay
	Lost      atomic.Uint64 // sequences that could not be recovered
	Restarts  atomic.Uint64 // publishers seen restarting (sequence went back)
	Rejected  atomic.Uint64 // events the index refused (unknown parent, token ids not filling the blocks)
}

// endSeq is the replay end marker's sequence.
const endSeq = ^uint64(0)

// ListenerConfig describes one publisher to follow (connect mode).
type ListenerConfig struct {
	// Endpoint is the publisher's PUB endpoint, e.g. tcp://127.0.0.1:5557.
	Endpoint string
	// Replay is its ROUTER replay endpoint, or "" when it has none.
	Replay string
	// Partition and Rank say where its events go; a payload's dp_rank
	// overrides Rank.DPRank.
	Partition selection.PartitionKey
	Rank      selection.Rank
	// ReplayTimeout bounds one replay exchange; 0 means 2 seconds.
	ReplayTimeout time.Duration
}

func (c *ListenerConfig) replayTimeout() time.Duration {
	if c.ReplayTimeout <= 0 {
		return 2 * time.Second
	}
	return c.ReplayTimeout
}

// Listener follows one publisher. Its goroutine owns its sockets.
type Listener struct {
	stream
	wait *readWait // nil: receives block with a timeout instead
	done chan struct{}
	once sync.Once
}

// stream is one publisher's sequence: it orders, replays and applies the
// publisher's messages. It belongs to the goroutine that reads them.
type stream struct {
	cfg   ListenerConfig
	zctx  *zmq.Context
	index *Index
	stats *Stats
	log   *zap.Logger
	stop  chan struct{}
	cur   cursor
	dec   Decoder
}

// cursor is the sequence state of one publisher (spec §6.4).
type cursor struct {
	started  bool
	last     uint64 // last sequence applied
	lastLive uint64 // last sequence received live
}

// StartListener starts following cfg's publisher. Stop ends it.
func StartListener(zctx *zmq.Context, index *Index, stats *Stats, log *zap.Logger, cfg ListenerConfig) (*Listener, error) {
	if log == nil {
		log = zap.NewNop()
	}
	sub, err := zctx.NewSocket(zmq.SUB)
	if err != nil {
		return nil, err
	}
	if err := setupSub(sub); err == nil {
		err = sub.Connect(cfg.Endpoint)
	}
	if err != nil {
		sub.Close()
		return nil, fmt.Errorf("kv events %s: %w", cfg.Endpoint, err)
	}
	l := &Listener{stream: stream{cfg: cfg, zctx: zctx, index: index, stats: stats, log: log, stop: make(chan struct{})},
		done: make(chan struct{})}
	l.wait = waitFor(sub, log)
	go l.run(sub)
	return l, nil
}

// waitFor is the socket's readWait, or nil (logged) when the descriptor
// cannot be polled.
func waitFor(sub *zmq.Socket, log *zap.Logger) *readWait {
	w, err := newReadWait(sub)
	if err != nil {
		log.Warn("kv events: cannot poll the ZMQ socket's descriptor; receiving with a timeout", zap.Error(err))
		return nil
	}
	return w
}

func setupSub(s *zmq.Socket) error {
	for _, err := range []error{
		s.SetLinger(0),
		s.SetRcvhwm(100_000),
		s.SetReconnectIvl(100 * time.Millisecond),
		s.SetReconnectIvlMax(5 * time.Second),
		s.SetTcpKeepalive(1),
		s.SetRcvtimeo(100 * time.Millisecond), // without a readWait: wake up to notice Stop
		s.SetSubscribe(""),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

// Config returns what the listener follows.
func (l *Listener) Config() ListenerConfig { return l.cfg }

// Stop ends the listener and waits until its socket is closed.
func (l *Listener) Stop() {
	l.once.Do(func() {
		close(l.stop)
		l.wait.interrupt()
	})
	<-l.done
}

func (l *Listener) run(sub *zmq.Socket) {
	defer close(l.done)
	defer sub.Close()
	defer l.wait.close()
	receive(sub, l.wait, l.stop, l.stats, func(_ []byte, seq uint64, payload []byte) {
		l.stats.Messages.Add(1)
		l.deliver(seq, payload)
	})
}

// receive reads live messages from sub until stop is closed (or the ZMQ
// context ends) and hands each well-framed one to handle; malformed frames
// are counted and skipped. It drains the socket without blocking and parks
// on w between messages; stopping interrupts w. Without w (or once w
// fails), it blocks in libzmq, whose receive timeout wakes the loop so it
// notices stop.
func receive(sub *zmq.Socket, w *readWait, stop <-chan struct{}, stats *Stats, handle func(topic []byte, seq uint64, payload []byte)) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		flags := zmq.Flag(0)
		if w != nil {
			flags = zmq.DONTWAIT
		}
		frames, err := sub.RecvMessageBytes(flags)
		if err != nil {
			switch {
			case zmq.AsErrno(err) == zmq.ETERM:
				return
			case w != nil && zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN):
				if !w.wait() {
					select {
					case <-stop:
					default:
						w = nil // the descriptor failed: fall back to the timeout
					}
				}
			}
			continue // the receive timeout, or a transient error
		}
		seq, payload, ok := liveFrames(frames)
		if !ok {
			stats.Malformed.Add(1)
			continue
		}
		handle(frames[0], seq, payload)
	}
}

// liveFrames checks a live message: [topic, seq8, payload].
func liveFrames(f [][]byte) (uint64, []byte, bool) {
	if len(f) != 3 || len(f[1]) != 8 {
		return 0, nil, false
	}
	return binary.BigEndian.Uint64(f[1]), f[2], true
}

// deliver applies one live message in sequence order, replaying what is
// missing first.
func (l *stream) deliver(seq uint64, payload []byte) {
	cur, dec := &l.cur, &l.dec
	switch {
	case cur.started && seq <= cur.lastLive:
		// Live messages arrive in order, so a sequence at or below the
		// last live one means the publisher restarted: its blocks are
		// stale. Drop them before anything new counts.
		l.stats.Restarts.Add(1)
		l.log.Info("kv event publisher restarted", zap.String("endpoint", l.cfg.Endpoint),
			zap.Uint64("seq", seq), zap.Uint64("last", cur.lastLive))
		l.index.RemoveRank(l.cfg.Partition, l.cfg.Rank)
		*cur = cursor{}
	case cur.started && seq <= cur.last:
		// Already applied through a replay that overtook the live stream.
		l.stats.Stale.Add(1)
		cur.lastLive = seq
		return
	}
	var from uint64
	if cur.started {
		from = cur.last + 1
	}
	if seq > from {
		// A gap, or a late join (from 0): fetch [from, seq).
		l.stats.Gaps.Add(1)
		l.recover(cur, dec, from, seq)
	}
	l.apply(dec, payload)
	cur.started, cur.last, cur.lastLive = true, seq, seq
}

// recover replays [from, to) from the publisher's replay endpoint. A
// late join (from 0) recovers what the publisher still buffers; only a gap
// in a stream already followed counts as lost.
func (l *stream) recover(cur *cursor, dec *Decoder, from, to uint64) {
	joined := cur.started
	cur.started = true
	if l.cfg.Replay == "" {
		if joined {
			l.stats.Lost.Add(to - from)
			l.log.Warn("kv events lost, no replay endpoint", zap.String("endpoint", l.cfg.Endpoint),
				zap.Uint64("from", from), zap.Uint64("to", to))
		}
		return
	}
	l.stats.Replays.Add(1)
	last, got, err := l.replay(dec, from, to)
	if got > 0 {
		cur.last = last
	}
	if got < to-from && joined {
		l.stats.Lost.Add(to - from - got)
		l.log.Warn("kv event replay incomplete", zap.String("endpoint", l.cfg.Replay),
			zap.Uint64("from", from), zap.Uint64("to", to), zap.Uint64("recovered", got), zap.Error(err))
	}
}

// replay dials the replay endpoint for one gap, asks for [from, …) and
// applies the replies below to, in order. A publisher whose buffer no
// longer reaches from starts later; the hole is skipped. It returns the
// last sequence applied and how many were.
func (l *stream) replay(dec *Decoder, from, to uint64) (last, got uint64, err error) {
	d, err := l.zctx.NewSocket(zmq.DEALER)
	if err != nil {
		return 0, 0, err
	}
	defer d.Close()
	deadline := time.Now().Add(l.cfg.replayTimeout())
	for _, err := range []error{d.SetLinger(0), d.SetRcvtimeo(50 * time.Millisecond), d.SetSndtimeo(l.cfg.replayTimeout()), d.Connect(l.cfg.Replay)} {
		if err != nil {
			return 0, 0, err
		}
	}
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], from)
	if _, err := d.SendMessage([]byte{}, req[:]); err != nil {
		return 0, 0, err
	}
	next := from
	for time.Now().Before(deadline) {
		select {
		case <-l.stop:
			return last, got, errors.New("stopped")
		default:
		}
		frames, err := d.RecvMessageBytes(0)
		if err != nil {
			continue // receive timeout: check the deadline and stop
		}
		seq, payload, ok := replayFrames(frames)
		if !ok {
			l.stats.Malformed.Add(1)
			continue
		}
		if seq == endSeq {
			return last, got, nil
		}
		if seq < next || seq >= to {
			continue // before what we asked, or already live
		}
		l.apply(dec, payload)
		l.stats.Replayed.Add(1)
		last, next = seq, seq+1
		got++
	}
	return last, got, errors.New("replay timed out")
}

// replayFrames accepts [“”, seq8, payload] and vLLM ≥ 0.26's
// [“”, topic, seq8, payload].
func replayFrames(f [][]byte) (uint64, []byte, bool) {
	if len(f) > 0 && len(f[0]) == 0 {
		f = f[1:]
	}
	if len(f) == 3 {
		f = f[1:]
	}
	if len(f) != 2 || len(f[0]) != 8 {
		return 0, nil, false
	}
	return binary.BigEndian.Uint64(f[0]), f[1], true
}

// apply decodes a payload and applies its events.
func (l *stream) apply(dec *Decoder, payload []byte) {
	b, err := dec.Decode(payload)
	if err != nil {
		l.stats.Malformed.Add(1)
		if c := l.log.Check(zap.DebugLevel, "malformed kv event payload"); c != nil {
			c.Write(zap.String("endpoint", l.cfg.Endpoint), zap.Error(err))
		}
		return
	}
	rank := l.cfg.Rank
	if b.DPRank >= 0 {
		rank.DPRank = uint32(b.DPRank)
	}
	for i := range b.Events {
		if err := l.index.Apply(l.cfg.Partition, rank, &b.Events[i]); err != nil {
			l.stats.Rejected.Add(1)
		}
	}
	l.stats.Batches.Add(1)
}
