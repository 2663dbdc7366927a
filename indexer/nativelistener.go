package indexer

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// A listener whose publisher the ingest loop reads itself (zmtpdial.go,
// zmtpconn.go): a tcp:// or ipc:// endpoint (with libzmq's source address
// too, when it is an address), on a loop. A goroutine
// dials, and dials again after a drop, and hands the connection's
// descriptor to the loop, which reads it; the loop hands a broken
// connection back to be dialed again. A listener that no loop can take,
// or whose endpoint the native dial does not speak, uses a libzmq SUB
// instead (listener.go).

// nativeDial is a native listener's dialing state.
type nativeDial struct {
	target  dialTarget
	conn    *zmtpConn // the loop's; nil while dialing
	ctx     context.Context
	cancel  context.CancelFunc // ends a dial under way (shutNative)
	dialing sync.WaitGroup

	mu      sync.Mutex
	pending int  // a dialed descriptor not yet taken by the loop; -1 for none
	over    bool // the loop has let the listener go: a late dial closes its own
}

// Redial intervals, as libzmq's defaults for the SUB: 100 ms after a
// drop, doubling after each failed dial up to 5 s.
const (
	redialFirst = 100 * time.Millisecond
	redialMax   = 5 * time.Second
)

// startNative places l on an ingest loop and starts dialing its
// publisher; false when the endpoint is not one to dial natively or no
// loop can take l.
func (l *Listener) startNative() bool {
	target, ok := dialTargetOf(l.cfg.Endpoint)
	if !ok || l.cfg.viaLibzmq {
		return false
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.native = &nativeDial{target: target, ctx: ctx, cancel: cancel, pending: -1}
	l.conn.known = true
	if !l.index.joinLoop(l) {
		cancel()
		l.native = nil
		return false
	}
	l.dial(0)
	return true
}

// dial dials the publisher after wait, again and again until it answers
// or the listener stops, and hands the descriptor to the loop. The first
// failure of a round is a warning (a publisher the gateway cannot reach
// hears nothing, and says nothing), the rest are debug lines.
func (l *Listener) dial(wait time.Duration) {
	n := l.native
	n.dialing.Go(func() {
		level := zap.WarnLevel
		for {
			if wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-l.stop:
					t.Stop()
					return
				case <-t.C:
				}
			}
			fd, err := dialSub(n.ctx, n.target)
			if err == nil {
				n.mu.Lock()
				if n.over {
					n.mu.Unlock()
					syscall.Close(fd)
					return
				}
				n.pending = fd
				n.mu.Unlock()
				l.loop.ask(askAttach, l)
				return
			}
			select {
			case <-l.stop:
				return
			default:
			}
			l.stats.DialFailures.add(1)
			if c := l.log.Check(level, "kv events: cannot reach the publisher; dialing again"); c != nil {
				c.Write(zap.String("endpoint", l.cfg.Endpoint), zap.Error(err))
			}
			level = zap.DebugLevel
			wait = min(max(2*wait, redialFirst), redialMax)
		}
	})
}

// attach puts the dialed descriptor in the loop's set (loop goroutine).
func (p *ingestLoop) attach(l *Listener) {
	n := l.native
	n.mu.Lock()
	fd := n.pending
	n.pending = -1
	n.mu.Unlock()
	if fd < 0 {
		return
	}
	if l.closed {
		syscall.Close(fd)
		return
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | -syscall.EPOLLET, Fd: l.slot}
	if err := syscall.EpollCtl(p.inner, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		syscall.Close(fd)
		l.log.Warn("kv events: a dialed publisher could not be watched; dialing again", zap.String("endpoint", l.cfg.Endpoint), zap.Error(err))
		l.dial(redialFirst)
		return
	}
	n.conn = newZMTPConn(fd, maxMsgSize(l.cfg.MaxMessageBytes))
	l.conn.up.Store(true)
	p.heat(l) // what came before the edge the set will report
}

// detach drops a broken connection, counts it and dials again (loop
// goroutine): a bound broken is a cut, anything else a disconnect.
func (p *ingestLoop) detach(l *Listener, err error) {
	n := l.native
	// Counted before the close, which the publisher sees.
	if errors.Is(err, errZMTP) {
		l.stats.Cut.add(1)
		l.log.Debug("kv events: publisher cut off", zap.String("endpoint", l.cfg.Endpoint), zap.Error(err))
	} else {
		l.stats.Disconnects.add(1)
		l.log.Debug("kv events: publisher connection dropped", zap.String("endpoint", l.cfg.Endpoint), zap.Error(err))
	}
	l.conn.up.Store(false)
	_ = syscall.EpollCtl(p.inner, syscall.EPOLL_CTL_DEL, n.conn.fd, nil)
	n.conn.close()
	n.conn = nil
	l.dial(redialFirst)
}

// shutNative closes the connection and ends the dialing (loop goroutine,
// as the listener leaves): a dial under way is cancelled, so the wait for
// it is short (one waiting to redial saw Stop close l.stop), and a
// descriptor it dialed meanwhile is closed here or by the dial.
func (l *Listener) shutNative(p *ingestLoop) {
	n := l.native
	n.cancel()
	n.dialing.Wait()
	n.mu.Lock()
	n.over = true
	if n.pending >= 0 {
		syscall.Close(n.pending)
		n.pending = -1
	}
	n.mu.Unlock()
	l.conn.up.Store(false)
	if n.conn != nil {
		_ = syscall.EpollCtl(p.inner, syscall.EPOLL_CTL_DEL, n.conn.fd, nil)
		n.conn.close()
		n.conn = nil
	}
}
