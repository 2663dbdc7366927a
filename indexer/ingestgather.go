package indexer

import (
	"sync/atomic"
	"syscall"
	"time"
)

// Gathering: a loop in front of a fleet sending at its own pace.
//
// A fleet sends when its engines step, so outside a burst a message
// mostly finds its socket, and the loop, idle: each one woke the loop on
// its own. At 250k blocks a second from 1,024 publishers that was about
// 65 µs of gateway CPU a message (4.1k ns a block), most of it the price
// of waking an idle core's thread and letting it sleep again, paid twice
// a message: once by libzmq's I/O thread, once by the Go thread the
// poller woke for the loop. Only the second is ours to spare. A loop whose
// wake-ups come less than gatherWindow apart stops listening for its
// listeners' edges (it takes the inner set out of the outer one's
// interest) and looks at the inner set once every gatherWindow instead:
// every message that arrived meanwhile is served from one wake-up. A look
// that finds nothing puts the inner set back, and the loop parks on edges
// as before. A fleet sending flat out never parks either way (some
// listener always has messages), and one that sends rarely never gathers.
//
// The price is lag: an event reaches the index up to a window later than
// it would have (a window's sleep lasts 1.1 ms or more: Go's timers),
// against engine steps of tens of milliseconds
// between a block's store and the request that could use it. Asks (a
// Stop, a redial) are taken once a window while gathering, since the
// loop then does not listen to its doorbell between looks.

// gatherWindow is how long a gathering loop lets messages wait, and how
// close together wake-ups must come for a loop to start gathering.
const gatherWindow = time.Millisecond

// gather is a loop's gathering state: how many times it started and
// stopped gathering. Only the loop's goroutine changes them; tests read
// them from others.
type gather struct {
	gathers, ungathers atomic.Uint64
}

// gathering reports whether the loop is gathering.
func (g *gather) gathering() bool { return g.gathers.Load() != g.ungathers.Load() }

// woken notes that a park ended after waited: with messages ready that
// soon, the loop starts gathering.
func (p *ingestLoop) woken(waited time.Duration) {
	if waited < gatherWindow && len(p.hot) > 0 && p.listen(false) {
		p.gathers.Add(1)
	}
}

// look waits a window with the turn let go, then takes what the inner
// set holds; when it holds nothing, the loop goes back to edges.
func (p *ingestLoop) look() {
	p.turn.leave()
	time.Sleep(gatherWindow)
	if p.collect() == 0 && p.listen(true) {
		// An edge between the collect and the listen is not lost: putting
		// the inner set back reports it if it holds events, and the park's
		// first check reads the inner set itself.
		p.ungathers.Add(1)
	}
}

// listen puts the inner set in the outer's interest (on) or takes it out;
// false when epoll refused, and the loop keeps the mode it had.
func (p *ingestLoop) listen(on bool) bool {
	ev := syscall.EpollEvent{Fd: innerTag}
	if on {
		ev.Events = syscall.EPOLLIN | -syscall.EPOLLET
	}
	return syscall.EpollCtl(p.outer, syscall.EPOLL_CTL_MOD, p.inner, &ev) == nil
}
