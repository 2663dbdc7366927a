package indexer

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/zap"
)

// A socket monitor per libzmq SUB, for the connections libzmq drops (a
// connect-mode listener the ingest loop reads itself has no SUB and needs
// none: nativelistener.go dials again).
//
// ZMQ_MAXMSGSIZE makes libzmq refuse an oversized frame from its size
// header, but it does so by treating the connection as a protocol error:
// it closes it and, in libzmq 4.3, a connecting socket does not reconnect
// after a protocol error (only after a connection error). A connect-mode
// SUB would stay deaf to its publisher for good after one oversized
// message. The monitor reports ZMQ_EVENT_DISCONNECTED, which the listener
// answers by dialing again; every such event is counted in
// Stats.Disconnects. No monitor event carries the reason of a disconnect
// (EMSGSIZE is not reported, nor ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL, which
// covers the handshake only), so oversized messages are counted together
// with publishers that went away. A bound SUB needs no redial: its peer
// is the connecting side and reconnects.
//
// Cost: the monitor is two PAIR sockets (libzmq's, bound on inproc, and
// ours) and a duplicated descriptor to park on, so three more descriptors
// and two more sockets per SUB.
//
// Ending it: the SUB's owner detaches the monitor (zmq_socket_monitor with
// no endpoint) before closing the SUB, and the monitor's goroutine reads
// libzmq's last event, MONITOR_STOPPED, before closing its PAIR. A SUB
// closed with its monitor attached left its three descriptors and sockets
// in the context until the context ended (libzmq 4.3), and every socket
// closed in that context afterwards too: a reload that toggled one such
// worker grew the gateway by three descriptors each time.

// monitorSeq numbers monitor endpoints, unique in the process.
var monitorSeq atomic.Uint64

// monitor reads a socket's disconnect events in its own goroutine.
type monitor struct {
	pair     *zmq.Socket
	wait     *readWait // nil: receives with a timeout instead
	quit     chan struct{}
	done     chan struct{}
	detached bool // libzmq was told to stop: its MONITOR_STOPPED ends run
}

// monitorStoppedWait bounds how long stop waits for MONITOR_STOPPED
// before it ends the goroutine itself.
const monitorStoppedWait = time.Second

// newMonitor attaches a monitor to sock, which the caller owns and calls
// it from (a libzmq socket is one goroutine's at a time); start begins
// reading its events.
func newMonitor(zctx *zmq.Context, sock *zmq.Socket, log *zap.Logger) (*monitor, error) {
	addr := fmt.Sprintf("inproc://kvrouter-monitor-%d", monitorSeq.Add(1))
	if err := sock.Monitor(addr, zmq.EVENT_CONNECTED|zmq.EVENT_DISCONNECTED|zmq.EVENT_MONITOR_STOPPED); err != nil {
		return nil, err
	}
	pair, err := zctx.NewSocket(zmq.PAIR)
	if err == nil {
		if err = pair.SetLinger(0); err == nil {
			if err = pair.SetRcvtimeo(100 * time.Millisecond); err == nil {
				err = pair.Connect(addr)
			}
		}
		if err != nil {
			pair.Close()
		}
	}
	if err != nil {
		_ = sock.Monitor("", 0)
		return nil, err
	}
	return &monitor{pair: pair, wait: waitFor(pair, log), quit: make(chan struct{}), done: make(chan struct{})}, nil
}

// start reads the monitor's events on a goroutine of its own, setting up
// while the socket is connected and calling onDisconnect (from that
// goroutine) after counting each dropped connection in stats. A nil
// monitor starts nothing.
func (mo *monitor) start(stats *Stats, up *atomic.Bool, onDisconnect func()) {
	if mo != nil {
		go mo.run(stats, up, onDisconnect)
	}
}

// startMonitor is newMonitor and start.
func startMonitor(zctx *zmq.Context, sock *zmq.Socket, stats *Stats, log *zap.Logger, up *atomic.Bool, onDisconnect func()) (*monitor, error) {
	mo, err := newMonitor(zctx, sock, log)
	mo.start(stats, up, onDisconnect)
	return mo, err
}

// detach tells libzmq to stop monitoring sock; its owner calls it just
// before closing sock. A nil monitor has nothing to detach; a context
// that is ending refuses, and ends the monitor's reads itself.
func (mo *monitor) detach(sock *zmq.Socket) {
	if mo != nil {
		mo.detached = sock.Monitor("", 0) == nil
	}
}

func (mo *monitor) run(stats *Stats, up *atomic.Bool, onDisconnect func()) {
	defer close(mo.done)
	defer mo.pair.Close()
	defer mo.wait.close()
	w := mo.wait
	for {
		select {
		case <-mo.quit:
			return
		default:
		}
		flags := zmq.Flag(0)
		if w != nil {
			flags = zmq.DONTWAIT
		}
		ev, _, _, err := mo.pair.RecvEvent(flags)
		if err != nil {
			switch {
			case zmq.AsErrno(err) == zmq.ETERM:
				return
			case w != nil && zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN):
				if err := w.waitErr(); err != nil && !interrupted(err) {
					w = nil // the descriptor failed: fall back to the timeout
				}
			}
			continue
		}
		switch ev {
		case zmq.EVENT_CONNECTED:
			up.Store(true)
		case zmq.EVENT_DISCONNECTED:
			up.Store(false)
			stats.Disconnects.add(1)
			if onDisconnect != nil {
				onDisconnect()
			}
		case zmq.EVENT_MONITOR_STOPPED:
			up.Store(false)
			return
		}
	}
}

// discard ends a monitor that never started, its socket failing before
// it could: detached, its PAIR is closed here. A nil monitor has nothing
// to discard.
func (mo *monitor) discard(sock *zmq.Socket) {
	if mo == nil {
		return
	}
	mo.detach(sock)
	mo.wait.close()
	mo.pair.Close()
}

// stop ends the monitor and waits until its socket is closed: once it has
// read MONITOR_STOPPED when detached, else (or past monitorStoppedWait) at
// once. A nil monitor (one that could not start) has nothing to stop.
func (mo *monitor) stop() {
	if mo == nil {
		return
	}
	if mo.detached {
		t := time.NewTimer(monitorStoppedWait)
		select {
		case <-mo.done:
		case <-t.C:
		}
		t.Stop()
	}
	close(mo.quit)
	mo.wait.interrupt()
	<-mo.done
}
