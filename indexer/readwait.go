package indexer

import (
	"errors"
	"os"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// readWait parks a listener's goroutine until its SUB socket may have a
// message, on Go's network poller rather than inside libzmq. A blocking
// zmq_recv holds an OS thread for as long as it waits, and one with a
// timeout (so that the listener notices Stop) wakes that thread ten times
// a second: in front of 1,024 workers that was 1,024 threads and about
// half a core of the gateway's two spent doing nothing. libzmq signals
// work for a socket on its ZMQ_FD, an eventfd the poller can watch; a
// parked goroutine costs no thread and no wake-ups, and interrupt ends
// the wait at once.
type readWait struct {
	sock *zmq.Socket
	f    *os.File // a duplicate of the socket's ZMQ_FD, registered with the poller
	rc   syscall.RawConn
	// ready is waitErr's check, made once (a func value the poller keeps
	// would otherwise be allocated for every wait).
	ready func(fd uintptr) bool
}

// newReadWait watches s; with an error, the caller falls back to blocking
// receives with a timeout.
func newReadWait(s *zmq.Socket) (*readWait, error) {
	fd, err := s.GetFd()
	if err != nil {
		return nil, err
	}
	// A duplicate, so that closing the os.File (which also takes it off
	// the poller) leaves libzmq's own descriptor alone.
	syscall.ForkLock.RLock()
	dup, err := syscall.Dup(fd)
	if err == nil {
		syscall.CloseOnExec(dup)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, err
	}
	f, rc, err := onPoller(dup, "zmq_fd")
	if err != nil {
		return nil, err
	}
	w := &readWait{sock: s, f: f, rc: rc}
	w.ready = func(uintptr) bool {
		ev, err := s.GetEvents()
		return err != nil || ev&zmq.POLLIN != 0 // on an error, let the receive report it
	}
	return w, nil
}

// onPoller hands fd to Go's network poller, as an os.File that owns it
// (closing the file takes fd off the poller and closes it), and returns
// the file and its raw connection. On an error fd is closed.
func onPoller(fd int, name string) (*os.File, syscall.RawConn, error) {
	// os.NewFile only hands non-blocking descriptors to the poller (a
	// ZMQ_FD is one already; an epoll set is not).
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	rc, err := f.SyscallConn()
	if err == nil {
		// Deadlines work only on a descriptor the poller took.
		err = f.SetReadDeadline(time.Time{})
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, rc, nil
}

// waitFor calls try, which receives from the socket without blocking,
// until it reports that it is done (a message, or an error other than
// EAGAIN), and sleeps between calls until the socket may have a message.
// It returns nil once try is done, and otherwise the errors waitErr
// describes.
//
// A listener's try is its receive, in place of waitErr's ZMQ_EVENTS
// check: RawConn.Read clears the descriptor's readiness before its first
// call of try, so an edge after a receive that found nothing is
// remembered, and a ZMQ_EVENTS check before the sleep would only repeat
// what that receive did (it processes the socket's commands just as the
// check does). That is a getpid and a poll fewer a message for a
// listener that each message wakes, which is every listener of a fleet
// sending at its own pace: at 250k blocks a second from 1,024
// publishers, each message cost the gateway about 15 system calls and
// 70 µs of CPU (BENCHMARKS.md).
func (w *readWait) waitFor(try func(fd uintptr) bool) error { return w.rc.Read(try) }

// waitErr returns nil once the socket may have a message, an error
// wrapping os.ErrDeadlineExceeded once interrupt was called, any other
// error when the descriptor failed. ZMQ_FD is edge triggered and only
// says that commands reached the socket: ZMQ_EVENTS processes them and
// tells whether a message waits, so it is checked before every sleep. An
// edge that comes after that check wakes the poller, which remembers it
// even if the goroutine has not parked yet.
//
// The first check is needed even right after a receive found the socket
// empty (which processed its commands as ZMQ_EVENTS does): RawConn.Read
// clears the descriptor's readiness before it calls the check, so an edge
// that came between that receive and this wait is gone, and only the
// check sees what it announced. Skipping it after such a receive left
// listeners asleep over queued messages (the fleet benchmark hung twice
// in six runs); a receive made inside the wait instead (waitFor) comes
// after the clearing and takes the check's place.
func (w *readWait) waitErr() error { return w.waitFor(w.ready) }

// interrupted reports whether a waitErr error came from interrupt rather
// than from a failed descriptor.
func interrupted(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// interrupt ends the current or next wait; any goroutine may call it. A
// nil readWait (a listener receiving with a timeout) has nothing to end.
// Waits stay interrupted until rearm.
func (w *readWait) interrupt() {
	if w != nil {
		_ = w.f.SetReadDeadline(time.Unix(1, 0))
	}
}

// rearm lets waits block again after an interrupt that was a wake-up
// call, not a stop. The owner must check for a stop after rearming: a
// stop's interrupt that came before the rearm is undone by it.
func (w *readWait) rearm() {
	if w != nil {
		_ = w.f.SetReadDeadline(time.Time{})
	}
}

// close releases the duplicate descriptor; the socket is not touched. A
// nil readWait holds nothing.
func (w *readWait) close() {
	if w != nil {
		_ = w.f.Close()
	}
}
