package caddymodule

import (
	"context"
	"sync"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// The overload queue (docs/overload.md). A request whose model has no
// waiting request and a worker that is not busy goes straight on. Any
// other waits in its model's line, behind every earlier request of its
// class and of the classes above it. Only the line's head (the first of
// its highest class) asks the router whether a worker has capacity: when
// the handler frees a booking or sees a prefill complete it wakes the
// head (kick), and the head also looks again every headPoll, for capacity
// freed where the handler does not see it (a worker's busy mark running
// out, a booking freed through the selection API or by the TTL sweep).
// An admitted head wakes the next one once it has booked its worker, so
// a line drains as fast as capacity frees, one booking at a time.
//
// Waiting runs on the request's own goroutine: the queue starts none, and
// a client that goes away, a deadline or the handler's Cleanup takes its
// request out of the line.

// clearFor is how long a partition found not busy is not asked again
// (overloadQueue.clearFor; tests lengthen it):
// the router's answer takes the partition's lock, which every selection
// contends for, so the fast path asks at most about a thousand times a
// second per partition however many requests arrive. The cost: requests
// arriving within clearFor of the partition turning busy go on.
const clearFor = time.Millisecond

// headPoll is how often the head of a line looks for capacity freed
// where the handler does not see it.
const headPoll = 20 * time.Millisecond

// rateWindow is how many recent admissions estimate a line's admission
// rate, for the predicted wait of a newcomer.
const rateWindow = 32

// predictMargin is the share of max_wait a newcomer's predicted wait may
// take: the rate is an estimate, and a request that waits its whole
// max_wait only to be refused costs its client max_wait; one refused on
// arrival costs it nothing. In make overload at 2x capacity, 0.8 left 3%
// of the 429s to the deadline, 0.5 left 0.2%, with the same goodput
// (BENCHMARKS.md).
const predictMargin = 0.5

// shedReason says why a request left the queue without a worker; it is
// the reason label of kvrouter_overload_shed_total.
type shedReason string

const (
	shedQueueFull     shedReason = "queue_full"     // the line held queue_size requests
	shedPredictedWait shedReason = "predicted_wait" // at the line's admission rate it would wait past max_wait
	shedDeadline      shedReason = "deadline"       // it waited max_wait
	shedClosing       shedReason = "closing"        // the handler was cleaned up
	shedCanceled      shedReason = "canceled"       // its client went away (answered to no one)
)

// overloadQueue is the handler's lines, one per partition and scope
// (lineScope) that has had waiting requests.
type overloadQueue struct {
	s    overloadSettings
	busy func(selection.Partition, *selection.Placement) (busy, exists bool) // the router's PartitionBusy
	now  func() time.Time
	// clearFor is how long a not-busy answer is reused (the const).
	clearFor time.Duration

	mu     sync.Mutex
	lines  map[selection.PartitionKey]map[lineScope]*waitLine
	scoped int // lines of a scope other than the whole partition's
	closed bool
}

// lineScope is the part of a partition's workers a request may go to:
// all of them (the zero scope), or those serving a LoRA adapter, or
// those whose context fits a long prompt (contextlimit.go). A request
// waits in its scope's line, for its scope's workers: in the partition's
// line it would go on while any other worker is free, and get a 503, or
// hold up requests that any worker could take.
type lineScope struct {
	adapter string // the adapter whose workers alone may take it, or ""
	context uint64 // the shortest context among its workers; 0: any worker
}

// lineKey names one line.
type lineKey struct {
	part  selection.PartitionKey
	scope lineScope
}

// lineRequest is what the queue knows of a request: its line, and how it
// is placed, for the router's busy check.
type lineRequest struct {
	part      selection.Partition
	scope     lineScope
	placement *selection.Placement
}

func (r lineRequest) key() lineKey { return lineKey{r.part.Key(), r.scope} }

// maxScopedLines bounds the scoped lines kept: past it, the empty ones
// are dropped. Scopes come from the catalog (its adapters and contexts),
// but the catalog changes over time.
const maxScopedLines = 1024

// waitLine is one line's waiting requests, a FIFO per class. Lines exist
// for partitions of the catalog only (the router said they exist), and
// scopes the catalog made, so clients cannot grow the map.
type waitLine struct {
	classes [][]*waiter
	n       int
	// clearUntil is when the partition, found not busy, is asked again.
	clearUntil time.Time
	// admits is a ring of the latest admission times, for the rate.
	admits [rateWindow]time.Time
	nAdmit int
}

// waiter is one waiting request. wake has room for one signal, so a
// kick never blocks and never gets lost.
type waiter struct {
	class int
	wake  chan struct{}
}

func newOverloadQueue(s overloadSettings, busy func(selection.Partition, *selection.Placement) (bool, bool)) *overloadQueue {
	return &overloadQueue{s: s, busy: busy, now: time.Now, clearFor: clearFor, lines: map[selection.PartitionKey]map[lineScope]*waitLine{}}
}

// admission is how a request came through the queue.
type admission struct {
	queued bool          // it waited in a line (false: it went straight on)
	waited time.Duration // how long, when it did
	shed   shedReason    // why it may not go on; "" when it may
}

// wait returns once the request may book a worker, or when it must be
// refused.
func (q *overloadQueue) wait(ctx context.Context, lr lineRequest, class int) admission {
	key := lr.key()
	start := q.now()
	q.mu.Lock()
	line := q.line(key)
	idle := line == nil || line.n == 0
	clear := line != nil && start.Before(line.clearUntil)
	q.mu.Unlock()
	if idle && clear {
		return admission{}
	}
	if idle {
		busy, exists := q.busy(lr.part, lr.placement)
		if !busy {
			if exists {
				q.noteClear(key, start)
			}
			return admission{}
		}
	}
	w := &waiter{class: class, wake: make(chan struct{}, 1)}
	if reason := q.enqueue(key, w, start); reason != "" {
		return admission{shed: reason}
	}
	model := key.part.Model
	queueDepth.WithLabelValues(model).Inc()
	defer queueDepth.WithLabelValues(model).Dec()
	deadline := time.NewTimer(q.s.maxWait)
	defer deadline.Stop()
	poll := time.NewTicker(headPoll)
	defer poll.Stop()
	for {
		if q.isHead(key, w) && !q.isBusy(lr) && q.admit(key, w) {
			return admission{queued: true, waited: q.now().Sub(start)}
		}
		select {
		case <-w.wake:
		case <-poll.C:
		case <-deadline.C:
			return q.leave(key, w, start, shedDeadline)
		case <-ctx.Done():
			return q.leave(key, w, start, shedCanceled)
		}
		if q.isClosed() {
			return q.leave(key, w, start, shedClosing)
		}
	}
}

// isBusy asks the router whether every worker the request may go to is
// busy.
func (q *overloadQueue) isBusy(lr lineRequest) bool {
	busy, _ := q.busy(lr.part, lr.placement)
	return busy
}

// noteClear remembers that the line's workers were not busy at now.
func (q *overloadQueue) noteClear(key lineKey, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.lineLocked(key).clearUntil = now.Add(q.clearFor)
}

// forgetClear drops the partition's not-busy answer: a booking found
// every worker full.
func (q *overloadQueue) forgetClear(key lineKey) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if line := q.line(key); line != nil {
		line.clearUntil = time.Time{}
	}
}

// line is key's line, nil when it has none. q.mu is held.
func (q *overloadQueue) line(key lineKey) *waitLine {
	return q.lines[key.part][key.scope]
}

// lineLocked is key's line, made when missing. q.mu is held.
func (q *overloadQueue) lineLocked(key lineKey) *waitLine {
	if line := q.line(key); line != nil {
		return line
	}
	if key.scope != (lineScope{}) {
		if q.scoped >= maxScopedLines {
			q.dropEmptyScopedLocked()
		}
		q.scoped++
	}
	scopes := q.lines[key.part]
	if scopes == nil {
		scopes = map[lineScope]*waitLine{}
		q.lines[key.part] = scopes
	}
	line := &waitLine{classes: make([][]*waiter, len(q.s.classes))}
	scopes[key.scope] = line
	return line
}

// dropEmptyScopedLocked drops the scoped lines no request waits in. q.mu
// is held.
func (q *overloadQueue) dropEmptyScopedLocked() {
	for _, scopes := range q.lines {
		for scope, line := range scopes {
			if scope != (lineScope{}) && line.n == 0 {
				delete(scopes, scope)
				q.scoped--
			}
		}
	}
}

// enqueue puts w at the end of its class, or says why it may not wait.
func (q *overloadQueue) enqueue(key lineKey, w *waiter, now time.Time) shedReason {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return shedClosing
	}
	line := q.lineLocked(key)
	if line.n >= q.s.queueSize {
		return shedQueueFull
	}
	ahead := 0
	for c := 0; c <= w.class; c++ {
		ahead += len(line.classes[c])
	}
	if rate := line.rate(now, q.s.maxWait); rate > 0 && float64(ahead+1)/rate > predictMargin*q.s.maxWait.Seconds() {
		return shedPredictedWait
	}
	line.classes[w.class] = append(line.classes[w.class], w)
	line.n++
	return ""
}

// rate is the line's admissions per second over its latest rateWindow
// admissions; 0 (unknown) with fewer than 8 of them, or when the latest
// is older than maxWait (the line was idle, and its past rate says
// nothing of now).
func (l *waitLine) rate(now time.Time, maxWait time.Duration) float64 {
	n := min(l.nAdmit, rateWindow)
	if n < 8 {
		return 0
	}
	latest := l.admits[(l.nAdmit-1)%rateWindow]
	oldest := l.admits[(l.nAdmit-n)%rateWindow]
	span := latest.Sub(oldest)
	if now.Sub(latest) > maxWait || span <= 0 {
		return 0
	}
	return float64(n-1) / span.Seconds()
}

// head is the line's first waiter of its highest class; nil when empty.
func (l *waitLine) head() *waiter {
	for _, c := range l.classes {
		if len(c) > 0 {
			return c[0]
		}
	}
	return nil
}

// remove takes w out of the line; false when it was not in it.
func (l *waitLine) remove(w *waiter) bool {
	c := l.classes[w.class]
	for i, x := range c {
		if x == w {
			copy(c[i:], c[i+1:])
			c[len(c)-1] = nil
			l.classes[w.class] = c[:len(c)-1]
			l.n--
			return true
		}
	}
	return false
}

func (q *overloadQueue) isHead(key lineKey, w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	line := q.line(key)
	return line != nil && line.head() == w
}

func (q *overloadQueue) isClosed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}

// admit takes the head out of its line to book a worker; the handler
// kicks the next head once it has (kick). False when w is no longer the
// head (a request of a higher class came meanwhile).
func (q *overloadQueue) admit(key lineKey, w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	line := q.line(key)
	if line == nil || line.head() != w {
		return false
	}
	line.remove(w)
	line.admits[line.nAdmit%rateWindow] = q.now()
	line.nAdmit++
	return true
}

// leave takes a waiter out of its line, wakes the new head if it was the
// head, and reports why.
func (q *overloadQueue) leave(key lineKey, w *waiter, start time.Time, why shedReason) admission {
	q.mu.Lock()
	if line := q.line(key); line != nil {
		wasHead := line.head() == w
		line.remove(w)
		if h := line.head(); wasHead && h != nil {
			signal(h)
		}
	}
	q.mu.Unlock()
	return admission{queued: true, waited: q.now().Sub(start), shed: why}
}

// kick wakes the head of each of a partition's lines: a worker may have
// capacity (a booking freed, a prefill completed, a waiter booked its
// worker), and which lines' workers it is, only their heads can tell.
func (q *overloadQueue) kick(key selection.PartitionKey) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, line := range q.lines[key] {
		if h := line.head(); h != nil {
			signal(h)
		}
	}
}

// close refuses every waiting and later request (Cleanup).
func (q *overloadQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	for _, scopes := range q.lines {
		for _, line := range scopes {
			for _, c := range line.classes {
				for _, w := range c {
					signal(w)
				}
			}
		}
	}
}

// depth is the number of requests waiting for a partition, in all its
// lines.
func (q *overloadQueue) depth(key selection.PartitionKey) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, line := range q.lines[key] {
		n += line.n
	}
	return n
}

func signal(w *waiter) {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}
