package indexer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Dialing a publisher as a ZMTP 3 subscriber, without libzmq (connect
// mode; zmtpconn.go reads what it sends). libzmq's receive path cost two
// thirds of a fleet's ingest CPU: its I/O thread's reads, the wake-up of
// the Go thread that takes each message from its queue, and the copy out
// of its buffer. Read by the ingest loop itself, a publisher's messages
// are taken straight from the socket, several per read (BENCHMARKS.md,
// "Receiving without libzmq").
//
// What is spoken (ZMTP 3.0, rfc.zeromq.org spec 23, and the NULL
// mechanism, spec 37; docs/kv-events.md §1): both sides send a 64-byte
// greeting and a READY command naming their socket type; once the
// publisher's READY has come (libzmq drops a peer whose message comes
// before its own READY went out), the subscriber subscribes to every
// topic with a one-byte message, 0x01. The gateway announces 3.0, the
// revision in which a subscription is such a message, which libzmq's
// publishers of every 4.x release take.

// zmtpDialTimeout bounds a dial and its handshake.
const zmtpDialTimeout = 2 * time.Second

// dialTarget is what Go dials for a connect-mode endpoint.
type dialTarget struct {
	network, addr string
	local         *net.TCPAddr // libzmq's "source;destination" form: the source; nil for any
}

// dialTargetOf maps a connect-mode endpoint to what Go dials; ok is false
// for one the native subscriber does not dial, which is left to libzmq
// (and its errors: a malformed endpoint is refused when the listener
// starts): inproc://, and a source named by its interface.
func dialTargetOf(endpoint string) (t dialTarget, ok bool) {
	switch {
	case strings.HasPrefix(endpoint, "tcp://"):
		t.network, t.addr = "tcp", strings.TrimPrefix(endpoint, "tcp://")
		if src, dst, two := strings.Cut(t.addr, ";"); two {
			if t.local, ok = sourceAddr(src); !ok {
				return t, false
			}
			t.addr = dst
		}
		_, port, err := net.SplitHostPort(t.addr)
		if err != nil {
			return t, false
		}
		_, err = strconv.ParseUint(port, 10, 16)
		return t, err == nil
	case strings.HasPrefix(endpoint, "ipc://"):
		t.network, t.addr = "unix", strings.TrimPrefix(endpoint, "ipc://")
		return t, t.addr != ""
	}
	return t, false
}

// libzmqIPv6 says whether a libzmq socket for endpoint may speak IPv6:
// yes, unless the endpoint names a source (tcp://source;destination) and
// its destination is an IPv4 address. With IPv6 on, libzmq takes a source
// interface's IPv6 address (lo's ::1), from which an IPv4 destination is
// never reached: tcp://lo:0;127.0.0.1:5557 never connected.
func libzmqIPv6(endpoint string) bool {
	src, dst, sourced := strings.Cut(strings.TrimPrefix(endpoint, "tcp://"), ";")
	if !sourced || src == "" || !strings.HasPrefix(endpoint, "tcp://") {
		return true
	}
	host, _, err := net.SplitHostPort(dst)
	if err != nil {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err != nil || !ip.Unmap().Is4()
}

// sourceAddr reads the source of libzmq's "source;destination" form: an
// address and a port, 0 or "*" for any.
func sourceAddr(src string) (*net.TCPAddr, bool) {
	host, port, err := net.SplitHostPort(src)
	if err != nil {
		return nil, false
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return nil, false
	}
	if port == "*" {
		port = "0"
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, false
	}
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(ip, uint16(p))), true
}

// dialSub dials a publisher, subscribes to every topic and returns the
// connection's descriptor, non-blocking and this process's alone (the Go
// connection it was dialed with is closed). ctx ends a dial under way.
func dialSub(ctx context.Context, t dialTarget) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, zmtpDialTimeout)
	defer cancel()
	d := net.Dialer{KeepAlive: 15 * time.Second}
	if t.local != nil {
		d.LocalAddr = t.local
	}
	c, err := d.DialContext(ctx, t.network, t.addr)
	if err != nil {
		return -1, err
	}
	defer c.Close()
	deadline, _ := ctx.Deadline()
	_ = c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := subHandshake(c); err != nil {
		return -1, err
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1, errors.New("no descriptor")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd, ferr := -1, error(nil)
	// A duplicate, so that closing c leaves the socket open; it shares c's
	// O_NONBLOCK.
	if err := rc.Control(func(f uintptr) { fd, ferr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, err
	}
	return fd, ferr
}

// subHandshake greets a publisher, exchanges READY commands and
// subscribes to every topic.
func subHandshake(c net.Conn) error {
	if err := greet(c, "SUB", "PUB", "XPUB"); err != nil {
		return err
	}
	_, err := c.Write([]byte{0, 1, 1}) // a message of one frame: subscribe to ""
	return err
}

// greet exchanges ZMTP 3.0 greetings (NULL security) and READY commands
// with a peer, naming our socket type typ; the peer's must be one of peers.
func greet(c net.Conn, typ string, peers ...string) error {
	var out [zmtpGreeting]byte
	out[0], out[9], out[10], out[11] = 0xff, 0x7f, 3, 0 // signature, ZMTP 3.0
	copy(out[12:32], "NULL")
	if _, err := c.Write(append(out[:], readyCommand(typ)...)); err != nil {
		return err
	}
	var in [zmtpGreeting]byte
	if _, err := io.ReadFull(c, in[:]); err != nil {
		return err
	}
	if err := checkGreeting(&in, 0, zmtpGreeting); err != nil {
		return err
	}
	return readReady(c, peers...)
}

// readyCommand is a READY command frame naming socket type typ.
func readyCommand(typ string) []byte {
	body := append([]byte{5}, "READY"...)
	body = append(body, byte(len("Socket-Type")))
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(typ)))
	body = append(body, typ...)
	return append([]byte{zmtpCommand, byte(len(body))}, body...)
}

// maxReadyBytes bounds the publisher's READY command: its socket type and
// an identity of up to 255 bytes, with room to spare.
const maxReadyBytes = 1024

// readReady reads the peer's READY command and checks that it names one
// of the socket types ours may talk to (a subscriber's: PUB and XPUB; a
// replay DEALER's: ROUTER).
func readReady(c net.Conn, peers ...string) error {
	var h [9]byte
	if _, err := io.ReadFull(c, h[:2]); err != nil {
		return err
	}
	if h[0]&^zmtpLong != zmtpCommand {
		return fmt.Errorf("%w: a frame of flags %#x where READY was due", errZMTP, h[0])
	}
	size := uint64(h[1])
	if h[0]&zmtpLong != 0 {
		if _, err := io.ReadFull(c, h[2:]); err != nil {
			return err
		}
		size = binary.BigEndian.Uint64(h[1:])
	}
	if size > maxReadyBytes {
		return fmt.Errorf("%w: a READY of %d bytes", errZMTP, size)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(c, body); err != nil {
		return err
	}
	if len(body) < 6 || string(body[:6]) != "\x05READY" {
		return fmt.Errorf("%w: the peer's first command is not READY", errZMTP)
	}
	typ, _ := readyProperty(body[6:], "Socket-Type")
	if !slices.Contains(peers, typ) {
		return fmt.Errorf("%w: the peer is a %q socket, not one of %v", errZMTP, typ, peers)
	}
	return nil
}

// readyProperty finds a property of a READY command's metadata: entries
// of a one-byte name length, the name, a four-byte value length and the
// value. Names compare without regard to case, as ZMTP says.
func readyProperty(meta []byte, name string) (string, bool) {
	for len(meta) > 0 {
		n := int(meta[0])
		if len(meta) < 1+n+4 {
			return "", false
		}
		key := string(meta[1 : 1+n])
		v := binary.BigEndian.Uint32(meta[1+n:])
		meta = meta[1+n+4:]
		if uint64(v) > uint64(len(meta)) {
			return "", false
		}
		if strings.EqualFold(key, name) {
			return string(meta[:v]), true
		}
		meta = meta[v:]
	}
	return "", false
}
