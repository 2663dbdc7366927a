package indexer

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sync"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/internal/zmqframes"
	"github.com/kvrouter/caddy-kvrouter/selection"
)

// The ZMQ side (docs/kv-events.md §1–3): a subscriber per publisher (its
// connection read by an ingest loop, nativelistener.go, or a libzmq SUB),
// 3-frame messages [topic, seq (8 bytes, big-endian), payload], sequence tracking,
// and replay of gaps over a DEALER dialed for that gap only.

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
	// FirstRank and RankCount are the worker's global data-parallel
	// ranks, [FirstRank, FirstRank+RankCount): a batch whose dp_rank
	// names another rank is dropped and counted in Stats.UnknownRank, so
	// a publisher cannot write under ranks its worker does not have.
	// RankCount 0 accepts any dp_rank.
	FirstRank, RankCount uint32
	// MaxMessageBytes bounds one ZMQ message (ZMQ_MAXMSGSIZE) on the SUB
	// and on replay DEALERs; 0 means DefaultMaxMessageBytes, negative no
	// bound.
	MaxMessageBytes int64
	// MaxGap is the largest live sequence jump taken as lost events; a
	// larger one is taken as a restart (Stats.Jumps). 0 means
	// DefaultMaxGap.
	MaxGap uint64
	// WorkerEndpoint is the worker's HTTP endpoint. A worker whose
	// endpoint changed is a different server: its config no longer
	// equals the old one, so its listeners and sequence state start anew.
	WorkerEndpoint string
	// viaLibzmq receives through a libzmq SUB even where the ingest loop
	// could read the publisher itself (nativelistener.go): a benchmark's
	// baseline.
	viaLibzmq bool
}

func (c *ListenerConfig) maxGap() uint64 {
	if c.MaxGap == 0 {
		return DefaultMaxGap
	}
	return c.MaxGap
}

// knownRank reports whether a payload's dp_rank is one of the worker's.
func (c *ListenerConfig) knownRank(dpRank uint32) bool {
	if c.RankCount == 0 {
		return true
	}
	return uint64(dpRank) >= uint64(c.FirstRank) && uint64(dpRank) < uint64(c.FirstRank)+uint64(c.RankCount)
}

func (c *ListenerConfig) replayTimeout() time.Duration {
	if c.ReplayTimeout <= 0 {
		return 2 * time.Second
	}
	return c.ReplayTimeout
}

// Listener follows one publisher. An ingest loop receives for it
// (ingestloop.go): from the publisher's connection, which the loop reads
// itself (native, nativelistener.go), or from a libzmq SUB the loop owns
// (an endpoint the native dial does not speak). One the loops cannot take
// has a SUB and a goroutine of its own (run).
type Listener struct {
	stream
	native *nativeDial // nil for a listener on a SUB
	sub    *zmq.Socket
	mon    *monitor // nil when the socket monitor could not start
	conn   connState
	done   chan struct{}
	once   sync.Once

	// loop receives for the listener; nil when it runs alone.
	loop     *ingestLoop
	fd       int                 // the SUB's ZMQ_FD, in the loop's set
	rx       *zmqframes.Receiver // the loop's receiver of the SUB
	unhooked chan struct{}       // closed once the loop has closed the SUB
	slot     int32               // the descriptor's tag in the loop's set
	// The loop's marks: hot (may have messages), away (handed off for
	// a replay), closed, leaving (Stop came while away), poked (a redial
	// came while away).
	hot, away, closed, leaving, poked bool

	// A listener running alone: its wait (nil: receives block with a
	// timeout instead) and its redial requests.
	wait   *readWait
	redial chan struct{}
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
	// written lists the ranks this publisher's payloads wrote to besides
	// cfg.Rank (a payload's dp_rank may name another of the worker's
	// ranks), so that a restart drops their blocks too.
	written []selection.Rank
	// turn is the reading goroutine's turn to ingest (ingestgate.go),
	// shared by the streams that goroutine reads.
	turn *ingestTurn
}

// cursor is the sequence state of one publisher (docs/kv-events.md §3).
type cursor struct {
	started  bool
	last     uint64 // last sequence applied
	lastLive uint64 // last sequence received live
	lag      lagWatch
}

// StartListener starts following cfg's publisher. Stop ends it.
func StartListener(zctx *zmq.Context, index *Index, stats *Stats, log *zap.Logger, cfg ListenerConfig) (*Listener, error) {
	if log == nil {
		log = zap.NewNop()
	}
	l := &Listener{stream: stream{cfg: cfg, zctx: zctx, index: index, stats: stats, log: log, stop: make(chan struct{}),
		turn: &ingestTurn{x: index}},
		redial: make(chan struct{}, 1), done: make(chan struct{}), unhooked: make(chan struct{})}
	if l.startNative() {
		return l, nil
	}
	sub, err := zctx.NewSocket(zmq.SUB)
	if err != nil {
		return nil, err
	}
	if err = setupSub(sub, cfg.MaxMessageBytes, cfg.Endpoint); err != nil {
		sub.Close()
		return nil, fmt.Errorf("kv events %s: %w", cfg.Endpoint, err)
	}
	// Attached before the SUB connects, so that it sees the first
	// connection (attached after, a publisher already up was connected to
	// before it looked, and the listener never said it was connected);
	// before an ingest loop owns the SUB, and started after: its redials
	// go where l receives.
	if l.mon, err = newMonitor(zctx, sub, log); err != nil {
		log.Warn("kv events: no socket monitor; a connection libzmq drops for an oversized message is not dialed again",
			zap.String("endpoint", cfg.Endpoint), zap.Error(err))
	}
	if err = sub.Connect(cfg.Endpoint); err != nil {
		l.mon.discard(sub)
		sub.Close()
		return nil, fmt.Errorf("kv events %s: %w", cfg.Endpoint, err)
	}
	l.sub = sub
	l.conn.known = l.mon != nil
	alone := !l.joinLoop()
	l.mon.start(stats, &l.conn.up, l.askRedial)
	if alone {
		l.wait = waitFor(sub, log)
		go l.run(sub)
	}
	return l, nil
}

// joinLoop puts the listener on one of its index's ingest loops; false
// when none can take it.
func (l *Listener) joinLoop() bool {
	fd, err := l.sub.GetFd()
	if err != nil {
		l.log.Warn("kv events: no ZMQ descriptor to poll; receiving on a goroutine of its own", zap.Error(err))
		return false
	}
	l.fd, l.rx = fd, zmqframes.New(l.sub)
	if !l.index.joinLoop(l) {
		l.rx.Close()
		l.rx = nil
		l.log.Warn("kv events: no ingest loop could take the listener; receiving on a goroutine of its own",
			zap.String("endpoint", l.cfg.Endpoint))
		return false
	}
	return true
}

// askRedial asks the goroutine that owns the SUB to dial its publisher
// again (the monitor saw the connection dropped).
func (l *Listener) askRedial() {
	if l.loop != nil {
		l.loop.ask(askPoke, l)
		return
	}
	select {
	case l.redial <- struct{}{}:
	default: // one pending request is enough
	}
	l.wait.interrupt()
}

// dialAgain replaces the SUB's connection: after a protocol error (an
// oversized message) libzmq would not reconnect by itself. After an
// ordinary drop it would, and dialing at once does no harm.
func (l *Listener) dialAgain(sub *zmq.Socket) {
	err := sub.Disconnect(l.cfg.Endpoint)
	if err == nil {
		err = sub.Connect(l.cfg.Endpoint)
	}
	if err != nil {
		l.log.Warn("kv events: dialing the publisher again", zap.String("endpoint", l.cfg.Endpoint), zap.Error(err))
	}
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

// subQueue is how many received messages a SUB queues per publisher
// before it stops reading; see setupSub.
const subQueue = 64

// setupSub configures a SUB; maxBytes follows ListenerConfig's
// MaxMessageBytes convention.
func setupSub(s *zmq.Socket, maxBytes int64, endpoint string) error {
	for _, err := range []error{
		s.SetLinger(0),
		// libzmq reads a frame's size before its body and drops the
		// connection when it is over this: an oversized message is never
		// allocated, in C or in Go.
		s.SetMaxmsgsize(maxMsgSize(maxBytes)),
		// A publisher that sends faster than its events are applied
		// fills this queue; then libzmq stops reading the connection and
		// the messages wait on the publisher's side (vLLM's PUB keeps up
		// to 100,000), which drops them past its own bound. So the
		// gateway holds at most subQueue × MaxMessageBytes per
		// publisher: a flood cannot grow its memory, and a stalled
		// listener loses nothing a publisher can still hold.
		s.SetRcvhwm(subQueue),
		s.SetReconnectIvl(100 * time.Millisecond),
		s.SetReconnectIvlMax(5 * time.Second),
		s.SetTcpKeepalive(1),
		// libzmq sockets speak IPv4 only unless told: a worker known by
		// an IPv6 address (an AAAA record, a dual-stack pod) would never
		// be heard. But see libzmqIPv6.
		s.SetIpv6(libzmqIPv6(endpoint)),
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
		close(l.stop) // ends a replay under way
		if l.loop == nil {
			l.wait.interrupt()
			return
		}
		l.loop.ask(askLeave, l)
		<-l.unhooked
		l.mon.stop() // after the loop detached it and closed the SUB
		close(l.done)
	})
	<-l.done
}

func (l *Listener) run(sub *zmq.Socket) {
	defer close(l.done)
	defer l.mon.stop() // after the SUB is closed
	defer sub.Close()
	defer l.mon.detach(sub)
	defer l.wait.close()
	receive(sub, l.wait, l.stop, l.redial, func() { l.dialAgain(sub) }, l.stats, func(_ []byte, seq uint64, payload []byte) {
		l.stats.Messages.add(1)
		l.deliver(seq, payload)
	}, l.turn.leave)
}

// receive reads live messages from sub until stop is closed (or the ZMQ
// context ends) and hands each well-framed one to handle; malformed frames
// are counted and skipped. It drains the socket without blocking and parks
// on w between messages; stopping interrupts w. Without w (or once w
// fails), it blocks in libzmq, whose receive timeout wakes the loop so it
// notices stop. A request on poke (whose sender interrupts w) runs onPoke
// on this goroutine, which owns sub. The frames handle gets are valid
// until it returns: the next message is received into the same buffer.
func receive(sub *zmq.Socket, w *readWait, stop <-chan struct{}, poke <-chan struct{}, onPoke func(), stats *Stats,
	handle func(topic []byte, seq uint64, payload []byte), rest func()) {
	defer rest()
	rx := zmqframes.New(sub)
	defer rx.Close()
	// The receive a wait makes (see readWait.waitFor), made once: a func
	// value that escapes, and the variables it sets, would otherwise be
	// allocated for every message. The turn is given back before a sleep.
	var frames [][]byte
	var err error
	try := func(uintptr) bool {
		frames, err = rx.Recv(zmq.DONTWAIT)
		if err != nil && zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) {
			rest()
			return false
		}
		return true
	}
	for {
		// A stop first: a wait that a poke interrupted rearms, which undoes
		// the interrupt of a stop that came meanwhile, so a loop that took
		// the poke when both were there would wait with no wake-up to come.
		select {
		case <-stop:
			return
		default:
		}
		select {
		case <-poke:
			onPoke()
		default:
		}
		if w != nil {
			werr := w.waitFor(try)
			switch {
			case werr == nil:
			case interrupted(werr):
				// A stop or a poke. Rearm before the loop checks for a
				// stop, so that one arriving now still ends the next wait.
				w.rearm()
				continue
			default:
				w = nil // the descriptor failed: fall back to the timeout
				continue
			}
		} else {
			rest() // the receive may wait
			frames, err = rx.Recv(0)
		}
		if err != nil {
			if zmq.AsErrno(err) == zmq.ETERM {
				return
			}
			continue // the receive timeout, or a transient error
		}
		if seq, payload, ok := liveFrames(frames); ok {
			handle(frames[0], seq, payload)
		} else {
			stats.Malformed.add(1)
		}
		rx.Release() // malformed or not, the message may have grown the buffer
	}
}

// liveFrames checks a live message: [topic, seq8, payload].
func liveFrames(f [][]byte) (uint64, []byte, bool) {
	if len(f) != liveFrameCount || len(f[1]) != 8 {
		return 0, nil, false
	}
	return binary.BigEndian.Uint64(f[1]), f[2], true
}

// needsReplay reports whether delivering seq would first replay from the
// publisher: deliver's gap and late-join cases, a restart's late join
// included. That replay is the one step of a delivery that waits on the
// network, which an ingest loop must not.
func (l *stream) needsReplay(seq uint64) bool {
	cur := &l.cur
	if l.cfg.Replay == "" {
		return false
	}
	var from uint64
	switch {
	case cur.started && seq <= cur.lastLive: // a restart: the cursor starts afresh
	case cur.started && seq <= cur.last: // already replayed
		return false
	case cur.started && seq-cur.last-1 > l.cfg.maxGap(): // a jump, not replayed
		return false
	case cur.started:
		from = cur.last + 1
	}
	return seq > from
}

// deliver applies one live message in sequence order, replaying what is
// missing first; docs/kv-events.md §3 tabulates its cases.
func (l *stream) deliver(seq uint64, payload []byte) {
	cur, dec := &l.cur, &l.dec
	switch {
	case cur.started && seq <= cur.lastLive:
		// Live messages arrive in order, so a sequence at or below the
		// last live one means the publisher restarted: its blocks are
		// stale. Drop them before anything new counts.
		l.stats.Restarts.add(1)
		l.log.Info("kv event publisher restarted", zap.String("endpoint", l.cfg.Endpoint),
			zap.Uint64("seq", seq), zap.Uint64("last", cur.lastLive))
		l.dropRanks()
		*cur = cursor{}
	case cur.started && seq <= cur.last:
		// Already applied through a replay that overtook the live stream.
		l.stats.Stale.add(1)
		cur.lastLive = seq
		return
	case cur.started && seq-cur.last-1 > l.cfg.maxGap():
		// More missing than any publisher buffers: not lost events but a
		// restart that did not go back, or garbage. Counting the jump as
		// lost would let one message add 2^63 to Lost. Start afresh at
		// seq, with nothing to replay before it.
		l.stats.Jumps.add(1)
		l.log.Info("kv event sequence jumped; dropping the rank's blocks", zap.String("endpoint", l.cfg.Endpoint),
			zap.Uint64("seq", seq), zap.Uint64("last", cur.last))
		l.dropRanks()
		*cur = cursor{started: true, last: seq, lastLive: seq}
		l.noteLag(l.apply(dec, payload))
		return
	}
	var from uint64
	if cur.started {
		from = cur.last + 1
	}
	if seq > from {
		// A gap, or a late join (from 0): fetch [from, seq).
		l.stats.Gaps.add(1)
		l.recover(cur, dec, from, seq)
	}
	l.noteLag(l.apply(dec, payload))
	cur.started, cur.last, cur.lastLive = true, seq, seq
}

// noteLag counts a live batch applied behind its publisher (lag.go); a
// replayed one is behind by design and is not passed here.
func (l *stream) noteLag(stamp float64, applied bool) {
	if applied && l.cur.lag.late(stamp, time.Now()) {
		l.stats.Behind.add(1)
	}
}

// dropRanks drops the blocks of every rank the publisher wrote to.
func (l *stream) dropRanks() {
	l.index.RemoveRank(l.cfg.Partition, l.cfg.Rank)
	for _, r := range l.written {
		l.index.RemoveRank(l.cfg.Partition, r)
	}
	l.written = l.written[:0]
}

// recover replays [from, to) from the publisher's replay endpoint. A
// late join (from 0) recovers what the publisher still buffers; only a gap
// in a stream already followed counts as lost.
func (l *stream) recover(cur *cursor, dec *Decoder, from, to uint64) {
	joined := cur.started
	cur.started = true
	if l.cfg.Replay == "" {
		if joined {
			l.stats.Lost.add(to - from)
			l.log.Warn("kv events lost, no replay endpoint", zap.String("endpoint", l.cfg.Endpoint),
				zap.Uint64("from", from), zap.Uint64("to", to))
		}
		return
	}
	l.stats.Replays.add(1)
	last, got, err := l.replay(dec, from, to)
	if got > 0 {
		cur.last = last
	}
	if got < to-from && joined {
		l.stats.Lost.add(to - from - got)
		l.log.Warn("kv event replay incomplete", zap.String("endpoint", l.cfg.Replay),
			zap.Uint64("from", from), zap.Uint64("to", to), zap.Uint64("recovered", got), zap.Error(err))
	}
}

// replayFrames accepts [“”, seq8, payload] and vLLM ≥ 0.26's
// [“”, topic, seq8, payload] (docs/kv-events.md §2).
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

// apply decodes a payload and applies its events; it returns the batch's
// stamp and whether the batch was applied (false for a malformed payload
// or an unknown rank, which it counts).
func (l *stream) apply(dec *Decoder, payload []byte) (stamp float64, applied bool) {
	l.turn.enter()
	defer l.turn.pace()
	defer dec.Shed()
	b, err := dec.Decode(payload)
	if err != nil {
		l.stats.Malformed.add(1)
		if c := l.log.Check(zap.DebugLevel, "malformed kv event payload"); c != nil {
			c.Write(zap.String("endpoint", l.cfg.Endpoint), zap.Error(err))
		}
		return 0, false
	}
	rank := l.cfg.Rank
	if b.DPRank >= 0 {
		if b.DPRank > math.MaxUint32 || !l.cfg.knownRank(uint32(b.DPRank)) {
			l.stats.UnknownRank.add(1)
			return 0, false
		}
		rank.DPRank = uint32(b.DPRank)
		l.noteRank(rank)
	}
	l.stats.Rejected.add(uint64(l.index.ApplyBatch(l.cfg.Partition, rank, b.Events)))
	l.stats.Batches.add(1)
	return b.TS, true
}

// noteRank remembers a rank other than cfg.Rank that the publisher wrote
// to. Without a rank range (RankCount 0) the list is capped: a publisher
// naming endless ranks then leaves the rest to the worker's removal.
func (l *stream) noteRank(r selection.Rank) {
	if r == l.cfg.Rank || slices.Contains(l.written, r) || (l.cfg.RankCount == 0 && len(l.written) >= maxWritten) {
		return
	}
	l.written = append(l.written, r)
}

// maxWritten caps stream.written when the worker's ranks are not known.
const maxWritten = 64
