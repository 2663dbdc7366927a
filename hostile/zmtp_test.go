package hostile

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// zmtpPublisher is a PUB socket written by hand (ZMTP 3.0, NULL security),
// for the one attack a libzmq socket would make too costly for the test
// itself: frames of 400 MB. libzmq copies a message before sending it, so
// three such frames would cost the test process 1 GB or more; here the
// frame header announces 400 MB and the body is streamed from a 1 MiB
// buffer. It also shows how much of a frame the gateway read before
// hanging up, which is the point: a bounded subscriber refuses the frame
// at its header (ZMQ_MAXMSGSIZE) without reading, let alone allocating, it.
type zmtpPublisher struct {
	ln net.Listener
	ep string // tcp://127.0.0.1:port, for the worker's kv_events_endpoint
}

func newZMTPPublisher(t *testing.T) *zmtpPublisher {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return &zmtpPublisher{ln: ln, ep: "tcp://" + ln.Addr().String()}
}

// zmtpConn is one subscriber's connection, past the handshake.
type zmtpConn struct {
	c          net.Conn
	subscribed chan struct{} // closed when the subscriber subscribed
	gone       chan struct{} // closed when the subscriber hung up
}

// accept waits for the gateway's SUB to connect, greets it as a PUB and
// waits for its subscription.
func (p *zmtpPublisher) accept(d time.Duration) (*zmtpConn, error) {
	if tl, ok := p.ln.(*net.TCPListener); ok {
		_ = tl.SetDeadline(time.Now().Add(d))
	}
	c, err := p.ln.Accept()
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(d))
	// Greeting: signature, version 3.0, mechanism NULL, as-server 0.
	greet := make([]byte, 64)
	greet[0], greet[9], greet[10] = 0xff, 0x7f, 3
	copy(greet[12:], "NULL")
	if _, err := c.Write(greet); err != nil {
		c.Close()
		return nil, err
	}
	r := bufio.NewReader(c)
	peer := make([]byte, 64)
	if _, err := io.ReadFull(r, peer); err != nil || peer[0] != 0xff || peer[9] != 0x7f {
		c.Close()
		return nil, errors.New("the subscriber's greeting is not ZMTP 3")
	}
	// READY with Socket-Type PUB.
	ready := append([]byte{5}, "READY"...)
	ready = append(ready, 11)
	ready = append(ready, "Socket-Type"...)
	ready = binary.BigEndian.AppendUint32(ready, 3)
	ready = append(ready, "PUB"...)
	if _, err := c.Write(append([]byte{0x04, byte(len(ready))}, ready...)); err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	zc := &zmtpConn{c: c, subscribed: make(chan struct{}), gone: make(chan struct{})}
	go zc.read(r)
	select {
	case <-zc.subscribed:
		return zc, nil
	case <-zc.gone:
		return nil, errors.New("the subscriber hung up before subscribing")
	case <-time.After(d):
		c.Close()
		return nil, errors.New("the subscriber never subscribed")
	}
}

// read consumes the subscriber's frames: its READY, then its
// subscriptions (a message 0x01+topic in ZMTP 3.0, a SUBSCRIBE command in
// 3.1), until it hangs up.
func (zc *zmtpConn) read(r *bufio.Reader) {
	defer close(zc.gone)
	var once sync.Once
	for {
		flags, err := r.ReadByte()
		if err != nil {
			return
		}
		var size uint64
		if flags&0x02 != 0 {
			var b [8]byte
			if _, err := io.ReadFull(r, b[:]); err != nil {
				return
			}
			size = binary.BigEndian.Uint64(b[:])
		} else {
			b, err := r.ReadByte()
			if err != nil {
				return
			}
			size = uint64(b)
		}
		if size > 1<<20 {
			return // no subscriber sends that much
		}
		body := make([]byte, size)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		command := flags&0x04 != 0
		if (!command && len(body) > 0 && body[0] == 1) ||
			(command && len(body) > 10 && string(body[1:10]) == "SUBSCRIBE") {
			once.Do(func() { close(zc.subscribed) })
		}
	}
}

var filler = func() []byte {
	b := make([]byte, 1<<20)
	for i := range b {
		b[i] = 0xc0 // msgpack nil: garbage as a payload, but cheap to make
	}
	return b
}()

// sendBig sends [topic, seq, payload of size bytes] and reports how many
// payload bytes went out before the subscriber hung up (size if none).
func (zc *zmtpConn) sendBig(seq uint64, size int64) (int64, error) {
	hdr := []byte{0x01, 0} // empty topic, more to come
	hdr = append(hdr, 0x01, 8)
	hdr = binary.BigEndian.AppendUint64(hdr, seq)
	hdr = append(hdr, 0x02) // long frame, the last
	hdr = binary.BigEndian.AppendUint64(hdr, uint64(size))
	_ = zc.c.SetWriteDeadline(time.Now().Add(60 * time.Second))
	if _, err := zc.c.Write(hdr); err != nil {
		return 0, err
	}
	var sent int64
	for sent < size {
		n, err := zc.c.Write(filler[:min(int64(len(filler)), size-sent)])
		sent += int64(n)
		if err != nil {
			return sent, err
		}
	}
	return sent, nil
}

// sendSmall sends one ordinary message.
func (zc *zmtpConn) sendSmall(seq uint64, payload []byte) error {
	msg := []byte{0x01, 0, 0x01, 8}
	msg = binary.BigEndian.AppendUint64(msg, seq)
	if len(payload) < 256 {
		msg = append(msg, 0x00, byte(len(payload)))
	} else {
		msg = append(msg, 0x02)
		msg = binary.BigEndian.AppendUint64(msg, uint64(len(payload)))
	}
	_, err := zc.c.Write(append(msg, payload...))
	return err
}

// hungUp reports whether the subscriber closed the connection within d.
func (zc *zmtpConn) hungUp(d time.Duration) bool {
	select {
	case <-zc.gone:
		return true
	case <-time.After(d):
		return false
	}
}

func (zc *zmtpConn) close() { _ = zc.c.Close() }
