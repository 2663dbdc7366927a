package caddymodule

import (
	"io"
	"sync/atomic"
)

// A proxied request's body is a pooled buffer (bodies), put back when the
// handler returns. But the transport may still be writing the body to
// the worker then: a RoundTripper may close a request's body in a
// goroutine of its own after RoundTrip returned (net/http's contract),
// for instance when the worker answered before reading the whole body.
// Put back then, the buffer could be filled with the next request's body
// while the old one was still being sent: one client's prompt in another's
// request. So every reader of the buffer handed to the proxy is counted
// until it is closed, and the buffer goes back to the pool only when none
// is open; otherwise it is left to the collector.

// bodyLease counts the open readers of one pooled body buffer.
type bodyLease struct{ open atomic.Int64 }

// reader returns r as a request body counted until it is closed.
func (l *bodyLease) reader(r io.Reader) io.ReadCloser {
	l.open.Add(1)
	return &leasedBody{Reader: r, lease: l}
}

// idle reports whether every reader handed out has been closed.
func (l *bodyLease) idle() bool { return l.open.Load() == 0 }

// leasedBody is one counted reader; closing it twice counts once.
type leasedBody struct {
	io.Reader
	lease  *bodyLease
	closed atomic.Bool
}

func (b *leasedBody) Close() error {
	if b.closed.CompareAndSwap(false, true) {
		b.lease.open.Add(-1)
	}
	return nil
}
