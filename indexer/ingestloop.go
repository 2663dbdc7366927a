package indexer

import (
	"bytes"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// Ingest loops: one goroutine receives for many listeners.
//
// A goroutine per publisher parks on its own socket's descriptor, so
// every message a fleet sends wakes one: the network poller readies it,
// the scheduler wakes an idle core's thread to run it, and it takes the
// ingest turn from the listener before it and hands it to the next. In
// front of 1,024 publishers that churn was about a fifth of the gateway's
// ingest CPU (a gateway held to one core, which cannot wake another,
// spent 615 ns a block against 794), and every runnable listener stood
// between a request and a core. A loop instead holds an epoll set of its
// listeners' descriptors (the publisher's connection, which the loop reads
// itself, nativelistener.go; or a fallback SUB's ZMQ_FD), itself parked
// on Go's poller: one wake-up serves
// every listener that has messages, and while any has, the loop receives
// without parking at all; when messages come steadily but apart, it
// gathers them instead of waking for each (ingestgather.go). There are
// IngestCores loops (the cores ingest may use), started with the first
// listener and ended with the last.
//
// A loop never waits on anything but its set. A message that needs a
// replay first (a gap, a late join) is handed with its listener to a
// goroutine of its own, which replays, applies and hands the listener
// back; the loop leaves that socket alone meanwhile, and its messages
// wait unread (in the kernel's socket buffer, or libzmq's queue) as they
// would have behind an inline replay. Taking a dialed connection, dialing
// a SUB again (its monitor saw the connection drop) and closing a socket
// are asked of the loop, which owns its listeners' sockets.

// drainBatch is how many messages a loop takes from one listener before
// it serves the next, and drainBytes how many payload bytes: a publisher
// that sends without pause cannot keep the others waiting. The bytes
// bound a turn by the work it may hold: 16 messages of 4 MiB, each made
// of the events that cost most to apply, once kept every other
// publisher of the loop waiting 6-9 s (RELIABILITY.md); a turn now ends
// after the message that passes 1 MiB, and a payload holds at most
// maxEventsPerPayload events (decode.go).
const (
	drainBatch = 16
	drainBytes = 1 << 20
)

// spent adds a message's payload to what a turn has taken, and reports
// whether the turn is over.
func spent(frames [][]byte, taken *int) bool {
	*taken += len(frames[len(frames)-1])
	return *taken >= drainBytes
}

// loopEvents is how many ready descriptors one epoll_wait returns.
const loopEvents = 128

// A loop has two epoll sets: the inner holds its listeners' descriptors,
// tagged with their slot numbers from 0; the outer, the one on Go's
// poller, holds the doorbell and the inner set (ingestgather.go says why
// the inner is apart).
const (
	bellTag  = -1
	innerTag = -2
)

// ingestLoops places listeners on loops. Its mutex also guards each
// loop's member count, so a loop that finds none left and ends cannot
// race a listener joining it.
type ingestLoops struct {
	mu    sync.Mutex
	loops []*ingestLoop
}

// askKind is what a loop is asked to do with a listener.
type askKind uint8

const (
	askJoin   askKind = iota // start receiving for it
	askLeave                 // close its socket (Stop)
	askPoke                  // dial its publisher again (the monitor)
	askBack                  // its replay is over: receive for it again
	askAttach                // its publisher is dialed: receive from the connection (native)
)

type loopAsk struct {
	kind askKind
	l    *Listener
}

// ingestLoop is one receiving goroutine and its sets.
type ingestLoop struct {
	x     *Index
	inner int      // the listeners' epoll set
	outer int      // the doorbell's and the inner set's
	f     *os.File // outer on Go's poller
	rc    syscall.RawConn
	bell  int // an eventfd in the outer set, written to hand the loop asks
	rung  atomic.Bool

	mu    sync.Mutex
	asks  []loopAsk // guarded by mu
	ended bool      // guarded by mu: the doorbell is closed

	// Guarded by the Index's loops.mu: the listeners placed here, and
	// the epoll tags they may take.
	members  int
	nextSlot int32
	free     []int32

	// Owned by the loop's goroutine.
	turn  ingestTurn
	slots []*Listener // by epoll tag; nil for a free slot
	hot   []*Listener // listeners that may have messages waiting
	evs   [loopEvents]syscall.EpollEvent
	taken []loopAsk
	ready func(uintptr) bool // wait's check, made once
	gather
}

// joinLoop hands l to the index's least-loaded loop, starting one while
// there are fewer than IngestCores, and puts l's descriptor in its set.
// It returns false when no loop can take l (the caller runs l on a
// goroutine of its own).
func (x *Index) joinLoop(l *Listener) bool {
	x.loops.mu.Lock()
	defer x.loops.mu.Unlock()
	var p *ingestLoop
	for _, q := range x.loops.loops {
		if p == nil || q.members < p.members {
			p = q
		}
	}
	if p == nil || (p.members > 0 && len(x.loops.loops) < x.ingestCores()) {
		if q, err := newIngestLoop(x); err == nil {
			x.loops.loops = append(x.loops.loops, q)
			p = q
			go p.run()
		} else if p == nil {
			return false
		}
	}
	slot := p.nextSlot
	if n := len(p.free); n > 0 {
		slot, p.free = p.free[n-1], p.free[:n-1]
	} else {
		p.nextSlot++
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | -syscall.EPOLLET, Fd: slot}
	// A native listener's descriptor comes once it is dialed (attach).
	if err := l.watch(p.inner, &ev); err != nil {
		p.free = append(p.free, slot)
		if p.members == 0 {
			p.ask(askJoin, nil) // a loop just started for l: let it end
		}
		return false
	}
	p.members++
	l.loop, l.slot = p, slot
	p.ask(askJoin, l)
	return true
}

// watch puts a SUB's descriptor in the loop's set; a native listener has
// none yet.
func (l *Listener) watch(set int, ev *syscall.EpollEvent) error {
	if l.native != nil {
		return nil
	}
	return syscall.EpollCtl(set, syscall.EPOLL_CTL_ADD, l.fd, ev)
}

// newIngestLoop makes a loop's two sets, with the doorbell and the inner
// set in the outer, and puts the outer on Go's poller.
func newIngestLoop(x *Index) (*ingestLoop, error) {
	var fds []int // closed on an error
	fail := func(call string, err error) (*ingestLoop, error) {
		for _, fd := range fds {
			syscall.Close(fd)
		}
		return nil, os.NewSyscallError(call, err)
	}
	inner, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return fail("epoll_create1", err)
	}
	fds = append(fds, inner)
	outer, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return fail("epoll_create1", err)
	}
	fds = append(fds, outer)
	bell, _, errno := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return fail("eventfd2", errno)
	}
	fds = append(fds, int(bell))
	for _, m := range []struct{ fd, tag int }{{int(bell), bellTag}, {inner, innerTag}} {
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN | -syscall.EPOLLET, Fd: int32(m.tag)}
		if err := syscall.EpollCtl(outer, syscall.EPOLL_CTL_ADD, m.fd, &ev); err != nil {
			return fail("epoll_ctl", err)
		}
	}
	f, rc, err := onPoller(outer, "ingest-epoll") // closes outer on an error
	if err != nil {
		syscall.Close(inner)
		syscall.Close(int(bell))
		return nil, err
	}
	p := &ingestLoop{x: x, inner: inner, outer: outer, f: f, rc: rc, bell: int(bell)}
	p.turn.x = x
	p.ready = func(uintptr) bool {
		if p.collect() > 0 {
			return true
		}
		if x.parkGap != nil {
			x.parkGap()
		}
		if p.checkOuter() {
			return true
		}
		p.turn.leave() // parking: let another take the turn
		return false
	}
	return p, nil
}

// ask hands the loop a request and rings its doorbell unless it is rung.
// A loop that has ended ignores it: only a monitor's late poke can reach
// one, for a listener already closed. The doorbell is written under the
// mutex, so it cannot be closed meanwhile.
func (p *ingestLoop) ask(kind askKind, l *Listener) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return
	}
	p.asks = append(p.asks, loopAsk{kind, l})
	if !p.rung.Swap(true) {
		one := [8]byte{1}
		_, _ = syscall.Write(p.bell, one[:])
	}
}

// run serves the loop's listeners until the last has left.
func (p *ingestLoop) run() {
	defer p.close()
	defer p.turn.leave()
	for {
		if !p.takeAsks() {
			return
		}
		switch {
		case len(p.hot) > 0:
			p.collect()
		case p.gathering():
			p.look()
		default:
			p.park()
		}
		p.serve()
	}
}

// park waits on the outer set, on Go's poller, until a listener's
// descriptor or the doorbell has an edge.
func (p *ingestLoop) park() {
	since := time.Now()
	if err := p.rc.Read(p.ready); err != nil {
		// The poller refused the set, which it took at start: wait in
		// the kernel instead, a tick at a time.
		p.waitInKernel()
		return
	}
	p.woken(time.Since(since))
}

// waitInKernel blocks in epoll_wait on the outer set for up to 10 ms;
// only used when Go's poller failed.
func (p *ingestLoop) waitInKernel() {
	p.turn.leave()
	n, err := syscall.EpollWait(p.outer, p.evs[:], 10)
	if err == nil {
		p.markOuter(n)
	}
	p.collect()
}

// collect takes the inner set's ready events without blocking and marks
// their listeners hot; it returns how many there were.
func (p *ingestLoop) collect() int {
	n, err := syscall.EpollWait(p.inner, p.evs[:], 0)
	if err != nil {
		return 0
	}
	for _, ev := range p.evs[:n] {
		if int(ev.Fd) < len(p.slots) && p.slots[ev.Fd] != nil {
			p.heat(p.slots[ev.Fd]) // a tag not yet joined: its join heats it
		}
	}
	return n
}

// checkOuter takes the outer set's events without blocking and reports
// whether the loop has something to do: the doorbell rang, or the inner
// set has events. The inner set's edge counts: taken here, it is gone
// from the outer set, so Go's poller, looking at the outer set after
// this, would find nothing to report, and a message that arrived after
// collect looked would wait for the next edge (TestNoEdgeLostBetweenTheLooks).
func (p *ingestLoop) checkOuter() bool {
	n, err := syscall.EpollWait(p.outer, p.evs[:], 0)
	if err != nil {
		return false
	}
	return p.markOuter(n)
}

// markOuter reads the doorbell if it is among the first n events, so
// that the next ask rings it again, and reports whether there were any.
func (p *ingestLoop) markOuter(n int) bool {
	for _, ev := range p.evs[:n] {
		if ev.Fd == bellTag {
			// Read, then clear: cleared first, an ask made between the two
			// would ring and have its ring read here, leaving rung set
			// with nothing to wake the loop, so no later ask would ring
			// (Stop hung under -race). An ask whose swap still finds rung
			// set appended its request first, and takeAsks runs before
			// the loop parks again.
			var buf [8]byte
			_, _ = syscall.Read(p.bell, buf[:])
			p.rung.Store(false)
		}
	}
	return n > 0
}

// heat puts l on the hot list once.
func (p *ingestLoop) heat(l *Listener) {
	if !l.hot && !l.away && !l.closed {
		l.hot = true
		p.hot = append(p.hot, l)
	}
}

// serve gives every hot listener one drain, in order; those that still
// have messages stay hot for the next round.
func (p *ingestLoop) serve() {
	kept := p.hot[:0]
	for _, l := range p.hot {
		if l.closed || l.away {
			l.hot = false
			continue
		}
		if p.drain(l) {
			kept = append(kept, l)
			continue
		}
		l.hot = false
	}
	clear(p.hot[len(kept):])
	p.hot = kept
}

// drain receives and delivers up to drainBatch of l's messages, or
// until they pass drainBytes. It
// reports whether l may have more: false once its socket is empty (an
// edge on its descriptor will tell of the next) or it was handed off for
// a replay.
func (p *ingestLoop) drain(l *Listener) bool {
	if l.native != nil {
		return p.drainNative(l)
	}
	taken := 0
	for range drainBatch {
		frames, err := l.rx.Recv(zmq.DONTWAIT)
		if err != nil {
			// EAGAIN: empty. ETERM: the context is ending, and waits
			// for the socket to close. Anything else but an interrupted
			// call is left to the next edge rather than retried in a spin.
			if zmq.AsErrno(err) == zmq.ETERM {
				p.shut(l)
			}
			return zmq.AsErrno(err) == zmq.Errno(syscall.EINTR)
		}
		if !p.take(l, frames) {
			return false
		}
		over := spent(frames, &taken)
		l.rx.Release() // a malformed message may have grown the buffer too
		if over {
			break
		}
	}
	return true
}

// drainNative is drain for a listener whose connection the loop reads: a
// broken connection is dialed again (detach).
func (p *ingestLoop) drainNative(l *Listener) bool {
	taken := 0
	for range drainBatch {
		conn := l.native.conn
		if conn == nil {
			return false // dialing: attach heats it
		}
		frames, err := conn.next()
		if err != nil {
			if !isAgain(err) {
				p.detach(l, err)
			}
			return false
		}
		if !p.take(l, frames) {
			return false
		}
		if spent(frames, &taken) {
			break
		}
	}
	return true
}

// take delivers one received message of l, or counts it malformed; false
// when it needs a replay and was handed off (handOff) with l.
func (p *ingestLoop) take(l *Listener, frames [][]byte) bool {
	seq, payload, ok := liveFrames(frames)
	if !ok {
		l.stats.Malformed.add(1)
		return true
	}
	l.stats.Messages.add(1)
	if l.needsReplay(seq) {
		p.handOff(l, seq, payload)
		return false
	}
	l.deliver(seq, payload)
	return true
}

// handOff runs l's delivery of a message that needs a replay on a
// goroutine of its own, with an ingest turn of its own, and asks the loop
// to take l back when it is done. The payload is copied: the receiver's
// buffer is the loop's to reuse.
func (p *ingestLoop) handOff(l *Listener, seq uint64, payload []byte) {
	l.away = true
	payload = bytes.Clone(payload)
	if l.rx != nil {
		l.rx.Release()
	}
	go func() {
		turn := &ingestTurn{x: p.x}
		l.turn = turn
		l.deliver(seq, payload)
		turn.leave()
		l.turn = &p.turn
		p.ask(askBack, l)
	}()
}

// takeAsks carries out the asks made since the last call. It returns
// false once the loop has no listener left and has ended its service.
func (p *ingestLoop) takeAsks() bool {
	p.mu.Lock()
	p.taken, p.asks = p.asks, p.taken[:0]
	p.mu.Unlock()
	for i, a := range p.taken {
		p.carryOut(a)
		p.taken[i] = loopAsk{}
	}
	if len(p.taken) == 0 {
		return true
	}
	p.x.loops.mu.Lock()
	defer p.x.loops.mu.Unlock()
	if p.members > 0 {
		return true
	}
	loops := p.x.loops.loops
	for i, q := range loops {
		if q == p {
			p.x.loops.loops = append(loops[:i], loops[i+1:]...)
			break
		}
	}
	return false
}

// carryOut does one ask.
func (p *ingestLoop) carryOut(a loopAsk) {
	l := a.l
	switch a.kind {
	case askJoin:
		if l != nil { // nil: a join that failed, asked only to wake the loop
			p.add(l)
		}
	case askLeave:
		if l.away {
			l.leaving = true // closed when its replay hands it back
			return
		}
		p.remove(l)
	case askPoke:
		if l.closed || l.away {
			l.poked = l.poked || l.away
			return
		}
		l.dialAgain(l.sub)
		p.heat(l)
	case askAttach:
		p.attach(l)
	case askBack:
		l.away = false
		if l.leaving {
			p.remove(l)
			return
		}
		if l.poked {
			l.poked = false
			l.dialAgain(l.sub)
		}
		p.heat(l) // its messages queued meanwhile
	}
}

// add starts receiving for l, whose descriptor joinLoop put in the set;
// l starts hot, since messages may have queued before the set saw an edge.
func (p *ingestLoop) add(l *Listener) {
	for int(l.slot) >= len(p.slots) {
		p.slots = append(p.slots, nil)
	}
	p.slots[l.slot] = l
	l.turn = &p.turn
	p.heat(l)
}

// remove closes l's socket unless that is done, lets l go from the
// loop's count, and tells Stop.
func (p *ingestLoop) remove(l *Listener) {
	p.shut(l)
	p.slots[l.slot] = nil
	p.x.loops.mu.Lock()
	p.members--
	p.free = append(p.free, l.slot)
	p.x.loops.mu.Unlock()
	close(l.unhooked)
}

// shut takes l's descriptor out of the set and closes its socket, once.
// A socket whose context is ending is shut at once (terminating the
// context waits for it); l stays a member until Stop.
func (p *ingestLoop) shut(l *Listener) {
	if l.closed {
		return
	}
	l.closed = true
	if l.native != nil {
		l.shutNative(p)
		return
	}
	_ = syscall.EpollCtl(p.inner, syscall.EPOLL_CTL_DEL, l.fd, nil)
	l.rx.Close()
	l.mon.detach(l.sub)
	l.sub.Close()
}

// close releases the loop's sets and doorbell.
func (p *ingestLoop) close() {
	p.mu.Lock()
	p.ended = true
	_ = syscall.Close(p.bell)
	p.mu.Unlock()
	_ = p.f.Close()
	_ = syscall.Close(p.inner)
}
