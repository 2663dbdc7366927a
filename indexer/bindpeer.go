package indexer

import (
	"errors"
	"net"
	"syscall"
	"time"
)

// Bind mode without libzmq: the frame gate accepts a publisher's
// connection (framegate.go) and read, on that connection's goroutine,
// greets it as a ZMTP 3.0 subscriber (subHandshake, as connect mode's
// dial does) and reads its messages straight from the socket (zmtpConn),
// each routed to its worker's stream. The gate used to scan the stream
// and pass it on to a libzmq SUB bound behind it on a socket file (kept
// as a benchmark's baseline, limits.relayed): every message was read
// twice, by the gate and by libzmq's I/O thread, and woke two threads
// (BENCHMARKS.md, "Bind mode without libzmq"). The bounds are the same:
// a fourth frame, or a message over the bound, is cut at its header, and
// a refused topic as soon as its frame is whole (topicguard.go); a
// connection now holds at most the message it is reading, where a libzmq
// SUB queued up to subQueue of them.

// errStopping ends a reader because the listener stops.
var errStopping = errors.New("kv events bind listener stopping")

// read serves one publisher's connection until it ends or the listener
// stops, and says why it ended: errZMTP or errTopic for a connection cut
// for what it sent, errStopping, or the connection's own error.
func (b *BindListener) read(c net.Conn, guard *topicGuard) error {
	// A publisher greets at once; one that does not is not kept waiting
	// for, and does not hold one of the gate's places.
	_ = c.SetDeadline(time.Now().Add(zmtpDialTimeout))
	if err := subHandshake(c); err != nil {
		return err
	}
	_ = c.SetDeadline(time.Time{})
	sc, ok := c.(syscall.Conn)
	if !ok {
		return errors.New("kv events publisher connection has no descriptor")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	turn := &ingestTurn{x: b.index}
	defer turn.leave()
	var z *zmtpConn
	var ended error
	// The descriptor is used only inside Read's callback, where the
	// connection holds it open: closing the connection (Stop) waits for
	// the callback to return.
	err = rc.Read(func(fd uintptr) bool {
		if z == nil {
			z = newZMTPConn(int(fd), maxMsgSize(b.limits.maxMessageBytes))
			if guard != nil {
				z.onTopic = guard.check
			}
		}
		for {
			select {
			case <-b.stop:
				ended = errStopping
				return true
			default:
			}
			frames, err := z.next()
			if err != nil {
				if isAgain(err) {
					turn.leave() // parking: let another take the turn
					return false
				}
				ended = err
				return true
			}
			if seq, payload, ok := liveFrames(frames); ok {
				b.route(frames[0], seq, payload, turn)
			} else {
				b.stats.Malformed.add(1)
			}
		}
	})
	if ended != nil {
		return ended
	}
	return err
}
