package indexer

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// A replay exchange over the gateway's own ZMTP: a DEALER dialed to the
// publisher's ROUTER (docs/kv-events.md §2). Through a libzmq DEALER, a
// reply was bounded frame by frame only: libzmq holds every frame of an
// unfinished multipart message, so a publisher that answered with frames
// of 4 MiB without end, or millions of empty ones, made the gateway hold
// hundreds of megabytes, and a finished one was copied frame by frame
// past the exchange's deadline (RELIABILITY.md). Read here, a reply is
// cut at the header of a fifth frame or of the frame that takes it past
// kv_events_max_message, its bytes are held only as they come, and the
// connection's deadline is the exchange's.

// replyFrameCount is a reply's most frames: an empty delimiter, then
// vLLM ≥ 0.26's topic, the sequence and the payload (replayFrames).
const replyFrameCount = 4

// maxReplyCommands bounds the commands a publisher may send during one
// exchange (a heartbeat's PING, an ERROR): a few, not a stream.
const maxReplyCommands = 64

// replayConn is a replay exchange's connection and its reader.
type replayConn struct {
	c        net.Conn
	r        *bufio.Reader
	maxBytes int64 // one reply, all frames; < 0 no bound
	buf      []byte
	frames   [replyFrameCount][]byte
	commands int
}

// dialReplay dials the publisher's replay endpoint, greets it as a
// DEALER and asks for the batches from from on. The connection's
// deadline is the exchange's; closing it ends the exchange.
func dialReplay(ctx context.Context, t dialTarget, from uint64, maxBytes int64, deadline time.Time) (*replayConn, error) {
	d := net.Dialer{Deadline: deadline}
	if t.local != nil {
		d.LocalAddr = t.local
	}
	c, err := d.DialContext(ctx, t.network, t.addr)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(deadline)
	// ctx's end (the listener stopping) ends the handshake too.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := greet(c, "DEALER", "ROUTER"); err != nil {
		c.Close()
		return nil, err
	}
	// The request: an empty delimiter, then the first sequence wanted.
	req := []byte{zmtpMore, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint64(req[4:], from)
	if _, err := c.Write(req); err != nil {
		c.Close()
		return nil, err
	}
	return &replayConn{c: c, r: bufio.NewReaderSize(c, 16<<10), maxBytes: maxBytes}, nil
}

// next reads the next reply's frames, valid until the next call. It
// fails at the deadline, when the publisher closes the connection, and
// at a frame past the bounds, before the frame's body is read.
func (rc *replayConn) next() ([][]byte, error) {
	rc.buf = rc.buf[:0]
	var ends [replyFrameCount]int
	count := 0
	var total int64
	for {
		flags, size, err := rc.header()
		if err != nil {
			return nil, err
		}
		if flags&zmtpCommand != 0 {
			if size > maxCommandBytes {
				return nil, fmt.Errorf("%w: a command of %d bytes, over %d", errZMTP, size, maxCommandBytes)
			}
			if rc.commands++; rc.commands > maxReplyCommands {
				return nil, fmt.Errorf("%w: more than %d commands in one replay", errZMTP, maxReplyCommands)
			}
			if _, err := rc.r.Discard(int(size)); err != nil {
				return nil, err
			}
			continue
		}
		if err := checkMessageFrame(size, count, total, replyFrameCount, rc.maxBytes); err != nil {
			return nil, err
		}
		if size > maxFrameSize {
			return nil, fmt.Errorf("%w: frame size %d", errZMTP, size)
		}
		if err := rc.body(int(size)); err != nil {
			return nil, err
		}
		ends[count] = len(rc.buf)
		count++
		total += int64(size)
		if flags&zmtpMore == 0 {
			start := 0
			for i := range count {
				rc.frames[i] = rc.buf[start:ends[i]]
				start = ends[i]
			}
			return rc.frames[:count], nil
		}
	}
}

// header reads a frame's flags and size.
func (rc *replayConn) header() (byte, uint64, error) {
	flags, err := rc.r.ReadByte()
	if err != nil {
		return 0, 0, err
	}
	if err := checkFlags(flags); err != nil {
		return 0, 0, err
	}
	if flags&zmtpLong == 0 {
		n, err := rc.r.ReadByte()
		return flags, uint64(n), err
	}
	var n [8]byte
	if _, err := io.ReadFull(rc.r, n[:]); err != nil {
		return 0, 0, err
	}
	return flags, binary.BigEndian.Uint64(n[:]), nil
}

// body appends a frame's size bytes to buf, growing it by what has come
// rather than by what the header announced.
func (rc *replayConn) body(size int) error {
	const chunk = 64 << 10
	for size > 0 {
		n := min(size, chunk)
		at := len(rc.buf)
		if cap(rc.buf)-at < n {
			// Doubling, but never past one reply's bound (at+n is within
			// it: next checked the frame against it).
			limit := 2 * cap(rc.buf)
			if rc.maxBytes >= 0 {
				limit = min(limit, int(rc.maxBytes))
			}
			grown := make([]byte, at, max(limit, at+n))
			copy(grown, rc.buf)
			rc.buf = grown
		}
		rc.buf = rc.buf[:at+n]
		if _, err := io.ReadFull(rc.r, rc.buf[at:]); err != nil {
			return err
		}
		size -= n
	}
	return nil
}

// close ends the exchange.
func (rc *replayConn) close() { _ = rc.c.Close() }
