package indexer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"syscall"
	"time"
)

// zmtpConn reads a publisher's messages from a connection dialed by
// dialSub (connect mode) or accepted by the frame gate (bind mode),
// without blocking: whole messages are taken from a buffer that reads
// fill, several messages a read when they wait. A message of more than
// three frames, or of more than maxBytes in all, breaks the connection at
// that frame's header, before its body is read (the checks zmtpScan
// makes for the relay's baseline); libzmq bounded each frame but held the
// frames of an unfinished message without end (docs/kv-events.md §9).
//
// Commands between messages are read and dropped, but for PING, which
// gets its PONG (a publisher with ZMTP heartbeats on would otherwise take
// the connection for dead); each is bounded in size, in number inside a
// message, and in rate between messages.
//
// A bind-mode connection (bindpeer.go) also has its topics checked: each
// message's first frame is shown to onTopic as soon as that frame is
// whole, so a publisher refused its topic is cut before the rest of the
// message is read, as the gate's scan did; a topic over maxTopicBytes is
// cut at its header.
type zmtpConn struct {
	fd       int
	maxBytes int64 // one message, all frames; < 0 no bound
	buf      []byte
	off, n   int // buf[off:n] is read and not yet taken
	frames   [liveFrameCount][]byte

	onTopic func(topic []byte) error // nil: topics are not checked
	checked bool                     // the unfinished message's topic passed onTopic

	// The commands between messages a publisher may still send now, and
	// when that allowance was last refilled (allowCommand).
	commandsLeft  int
	commandsSince time.Time
}

// Buffer sizes: a connection starts with zmtpBufStart, grows to hold the
// message it reads, and after a message larger than zmtpBufKeep goes back
// to zmtpBufStart (1,024 publishers keep 16 MiB between them).
const (
	zmtpBufStart = 16 << 10
	zmtpBufKeep  = 64 << 10
)

// The bounds on a publisher's commands once it is connected: each at most
// maxCommandBytes (a PING carries 16 bytes of context, an ERROR a reason
// of up to 255), and at most maxCommandsWithin between one message's
// frames (a heartbeat's PING may fall there; a few at most).
const (
	maxCommandBytes   = 1024
	maxCommandsWithin = 16
)

// The rate of a publisher's commands: a burst of
// commandBurst, then commandRate a second. A heartbeat PINGs once an
// interval (a second or more in practice), far below it; a publisher
// past it is cut. Each command costs a parse, and a PING a write: a peer
// that kept the socket full of them, without a message, kept next from
// ever returning, so the ingest loop it shared served no one else, and
// a worker's deletion waited for the peer to stop (RELIABILITY.md).
const (
	commandBurst = 64
	commandRate  = 64
)

// errCommandRate cuts a publisher past the rate, whether its commands
// come between messages or inside them (16 at most inside each, which a
// stream of small messages would otherwise multiply without bound).
var errCommandRate = fmt.Errorf("%w: commands faster than %d a second", errZMTP, commandRate)

// maxFrameSize is the largest frame read even without a message bound
// (kv_events_max_message negative): past it, the size could not be held.
const maxFrameSize = math.MaxInt32

// messageRoom is the most one unfinished message can hold in the buffer:
// its frames and the commands among them, within maxBytes, and three
// frame headers of up to 9 bytes.
func (z *zmtpConn) messageRoom() int {
	if z.maxBytes < 0 {
		return math.MaxInt
	}
	return int(z.maxBytes) + liveFrameCount*9
}

func newZMTPConn(fd int, maxBytes int64) *zmtpConn {
	return &zmtpConn{fd: fd, maxBytes: maxBytes, buf: make([]byte, zmtpBufStart),
		commandsLeft: commandBurst, commandsSince: time.Now()}
}

// allowCommand takes one command between messages from the publisher's
// allowance, refilled at commandRate a second up to commandBurst; false
// when none is left. The clock is read only once a burst is spent.
func (z *zmtpConn) allowCommand() bool {
	if z.commandsLeft == 0 {
		now := time.Now()
		refill := now.Sub(z.commandsSince) * commandRate / time.Second
		if refill < 1 {
			return false
		}
		z.commandsLeft, z.commandsSince = int(min(refill, commandBurst)), now
	}
	z.commandsLeft--
	return true
}

// next returns the next message's frames, valid until the next call;
// EAGAIN once the socket is empty (an edge on its descriptor tells of
// more), any other error when the connection is over: io.EOF when the
// publisher closed it, errZMTP when it broke the protocol or a bound.
func (z *zmtpConn) next() ([][]byte, error) {
	for {
		frames, err := z.parse()
		if err != nil || frames != nil {
			return frames, err
		}
		if err := z.fill(); err != nil {
			return nil, err
		}
	}
}

// fill reads once more of a message that is not all there. The buffer
// grows only when it is full, to twice its size but never past what one
// message can take (messageRoom): what a frame's header announces is not
// allocated before its bytes come, so a publisher that announces
// kv_events_max_message and sends a trickle holds at most twice what it
// sent, and none holds more than one message.
func (z *zmtpConn) fill() error {
	if z.off > 0 {
		z.n = copy(z.buf, z.buf[z.off:z.n])
		z.off = 0
	}
	if z.n == len(z.buf) {
		// Doubling: growing by what a header or a frame needs copied the
		// whole buffer again for every few bytes (2 at a time between
		// frames). The buffer is full only while a message is unfinished,
		// which parse has checked against the bounds, so messageRoom is
		// above it.
		if size := min(2*len(z.buf), z.messageRoom()); size > len(z.buf) {
			grown := make([]byte, size)
			copy(grown, z.buf[:z.n])
			z.buf = grown
		}
	}
	for {
		m, err := syscall.Read(z.fd, z.buf[z.n:])
		switch {
		case m > 0:
			z.n += m
			return nil
		case err == syscall.EINTR:
			continue
		case err != nil:
			return err
		}
		return io.EOF
	}
}

// parse takes one whole message from buf[off:n]. When the message is not
// all there it takes nothing (nil frames, nil error); commands before the
// message are taken (and a PING answered), and those between its frames
// are answered once the message is whole.
func (z *zmtpConn) parse() (frames [][]byte, err error) {
	at, count := z.off, 0
	var total int64
	var within int // commands between this message's frames
	for {
		p := z.buf[at:z.n]
		if len(p) < 2 {
			return nil, nil
		}
		flags := p[0]
		if err := checkFlags(flags); err != nil {
			return nil, err
		}
		head, size := 2, uint64(p[1])
		if flags&zmtpLong != 0 {
			if len(p) < 9 {
				return nil, nil
			}
			head, size = 9, binary.BigEndian.Uint64(p[1:9])
		}
		command := flags&zmtpCommand != 0
		// The bounds, from the header alone. A command between a
		// message's frames counts against the message's bytes, header and
		// all (zmtpScan bounds each command alone): the buffer holds it
		// with the message until the message is whole, so commands
		// without end, even empty ones, must not grow it without end.
		held := size
		if command && count > 0 {
			held += uint64(head)
		}
		switch {
		case size > maxFrameSize:
			return nil, fmt.Errorf("%w: frame size %d", errZMTP, size)
		case command && size > maxCommandBytes:
			// A publisher's commands after its READY are PINGs and an
			// ERROR, of a few dozen bytes: a larger one would only make
			// the buffer hold it, before any topic is checked.
			return nil, fmt.Errorf("%w: a command of %d bytes, over %d", errZMTP, size, maxCommandBytes)
		case command && count > 0 && within >= maxCommandsWithin:
			// Each is held with the message and read again until the
			// message is whole: without a count, empty commands trickled
			// between two frames cost time quadratic in their number.
			return nil, fmt.Errorf("%w: more than %d commands inside one message", errZMTP, maxCommandsWithin)
		case command && z.maxBytes >= 0 && held > uint64(z.maxBytes-total):
			return nil, fmt.Errorf("%w: a command of more than %d bytes", errZMTP, z.maxBytes)
		case !command:
			if err := checkMessageFrame(size, count, total, liveFrameCount, z.maxBytes); err != nil {
				return nil, err
			}
			if count == 0 && z.onTopic != nil {
				if err := checkTopicSize(size); err != nil {
					return nil, err
				}
			}
		}
		if uint64(len(p)-head) < size {
			return nil, nil
		}
		body := p[head : head+int(size)]
		at += head + int(size)
		if command {
			if count == 0 { // between messages: taken now
				if !z.allowCommand() {
					return nil, errCommandRate
				}
				z.off = at
				z.command(body)
			} else {
				within++
				total += int64(held)
			}
			continue
		}
		z.frames[count] = body
		count++
		total += int64(size)
		if count == 1 && z.onTopic != nil && !z.checked {
			// parse reads an unfinished message again as more of it
			// comes: its topic is shown once.
			if err := z.onTopic(body); err != nil {
				return nil, err
			}
			z.checked = true
		}
		if flags&zmtpMore == 0 {
			if within > 0 {
				if err := z.commandsWithin(z.off, at); err != nil {
					return nil, err
				}
			}
			z.off = at
			z.checked = false
			z.shrink()
			return z.frames[:count], nil
		}
	}
}

// commandsWithin answers the commands among the frames of the message in
// buf[from:to], which parse has checked; errCommandRate once they pass
// the publisher's allowance.
func (z *zmtpConn) commandsWithin(from, to int) error {
	for at := from; at < to; {
		flags, head, size := z.buf[at], 2, int(z.buf[at+1])
		if flags&zmtpLong != 0 {
			head, size = 9, int(binary.BigEndian.Uint64(z.buf[at+1:at+9]))
		}
		if flags&zmtpCommand != 0 {
			if !z.allowCommand() {
				return errCommandRate
			}
			z.command(z.buf[at+head : at+head+size])
		}
		at += head + size
	}
	return nil
}

// shrink lets a buffer grown past zmtpBufKeep go once it holds nothing
// more; the frames just taken stay valid, in the old buffer.
func (z *zmtpConn) shrink() {
	if len(z.buf) > zmtpBufKeep && z.off == z.n {
		z.buf, z.off, z.n = make([]byte, zmtpBufStart), 0, 0
	}
}

// command answers a PING with a PONG carrying its context; other
// commands a publisher may send (ERROR, a late READY) need nothing.
func (z *zmtpConn) command(body []byte) {
	// PING: name "PING", a two-byte TTL, then a context of up to 16 bytes.
	if len(body) < 7 || string(body[:5]) != "\x04PING" {
		return
	}
	ctx := body[7:]
	if len(ctx) > 16 {
		ctx = ctx[:16]
	}
	pong := append([]byte{zmtpCommand, byte(5 + len(ctx)), 4, 'P', 'O', 'N', 'G'}, ctx...)
	// A full socket buffer drops the PONG: the publisher's next PING
	// asks again.
	_, _ = syscall.Write(z.fd, pong)
}

// close closes the connection's descriptor.
func (z *zmtpConn) close() {
	if z.fd >= 0 {
		_ = syscall.Close(z.fd)
		z.fd = -1
	}
}

// isAgain reports whether err from next only means "nothing yet".
func isAgain(err error) bool { return errors.Is(err, syscall.EAGAIN) }
