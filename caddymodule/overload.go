package caddymodule

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// The overload queue (docs/overload.md). A request whose model has no
// waiting request and a worker it may go to that is not busy goes
// straight on. Any other waits in its model's line, behind every earlier
// request of its class and of the classes above it. A request may go only
// to some of the model's workers (an adapter's, to those serving it; a
// long prompt, to those whose context fits it), so the line is not
// served strictly from its head: each time capacity may have freed (the
// handler frees a booking or sees a prefill complete: kick; or the head's
// look every headPoll, for capacity freed where the handler does not see
// it: a worker's busy mark running out, a booking freed through the
// selection API or by the TTL sweep), the queue admits the first waiter,
// in class and arrival order, some of whose workers are not busy
// (dispatch). A waiter for busy workers holds up none that could go
// elsewhere, and one arriving later for the same workers never passes
// it. One admission at a time: the next is made once the admitted
// request has booked its worker, so a line drains as fast as capacity
// frees, and two waiters are never let on for one free place.
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

// rateWindow is how many recent gaps between admissions estimate a
// line's admission rate, for the predicted wait of a newcomer.
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

// overloadQueue is the handler's lines, one per partition that has had
// waiting requests.
type overloadQueue struct {
	s    overloadSettings
	busy func(selection.Partition, *selection.Placement) (busy, exists bool) // the router's PartitionBusy
	now  func() time.Time
	// clearFor is how long a not-busy answer is reused (the const).
	clearFor time.Duration

	mu     sync.Mutex
	lines  map[selection.PartitionKey]*waitLine
	closed bool
}

// waitLine is one partition's waiting requests, a FIFO per class. Lines
// exist for partitions of the catalog only (the router said they exist),
// so clients cannot grow the map.
type waitLine struct {
	classes [][]*waiter
	n       int
	// clearUntil is when the partition, found not busy, is asked again
	// (for a request that may go to any of its workers).
	clearUntil time.Time
	// admitting is when the latest admitted waiter was let on, zero once
	// it has booked (settled): no other is admitted meanwhile, unless it
	// has not booked within headPoll.
	admitting time.Time
	// gaps is a ring of the latest admissions' waiting times (noteAdmission),
	// for the rate; lastAdmit is the latest admission, and waitingSince
	// when the line last went from empty to holding a waiter.
	gaps         [rateWindow]time.Duration
	nGaps        int
	lastAdmit    time.Time
	waitingSince time.Time
}

// waiter is one waiting request. wake has room for one signal, so a
// kick never blocks and never gets lost.
type waiter struct {
	class int
	wake  chan struct{}
	req   lineRequest
	// admitted is set, under the queue's lock, when dispatch lets it on.
	admitted bool
}

// lineRequest is what the queue knows of a request: its partition, and
// how it is placed, for the router's busy check; scope names the workers
// it may go to, so that one busy check stands for every waiter of a
// scope.
type lineRequest struct {
	part      selection.Partition
	scope     lineScope
	placement *selection.Placement
}

// lineScope is the part of a partition's workers a request may go to:
// all of them (the zero scope), those serving a LoRA adapter, or those
// whose context fits a long prompt (contextlimit.go).
type lineScope struct {
	adapter string // the adapter whose workers alone may take it, or ""
	context uint64 // the shortest context among its workers; 0: any worker
}

func newOverloadQueue(s overloadSettings, busy func(selection.Partition, *selection.Placement) (bool, bool)) *overloadQueue {
	return &overloadQueue{s: s, busy: busy, now: time.Now, clearFor: clearFor, lines: map[selection.PartitionKey]*waitLine{}}
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
	key := lr.part.Key()
	anyWorker := lr.scope == lineScope{}
	start := q.now()
	q.mu.Lock()
	line := q.lines[key]
	idle := line == nil || line.n == 0
	clear := anyWorker && line != nil && start.Before(line.clearUntil)
	q.mu.Unlock()
	if idle && clear {
		return admission{}
	}
	if idle {
		busy, exists := q.busy(lr.part, lr.placement)
		if !busy {
			if exists && anyWorker {
				q.noteClear(key, start)
			}
			return admission{}
		}
	}
	w := &waiter{class: class, wake: make(chan struct{}, 1), req: lr}
	if reason := q.enqueue(key, w, start); reason != "" {
		return admission{shed: reason}
	}
	// The gauge is held, not looked up again: were the model's series
	// pruned meanwhile (modellabels.go), a lookup would make one of -1.
	depth := queueDepth.WithLabelValues(modelLabels.of(key.Model))
	depth.Inc()
	defer depth.Dec()
	q.dispatch(key) // a waiter for idle workers goes on at once
	deadline := time.NewTimer(q.s.maxWait)
	defer deadline.Stop()
	poll := time.NewTicker(headPoll)
	defer poll.Stop()
	for {
		if q.isAdmitted(w) {
			return admission{queued: true, waited: q.now().Sub(start)}
		}
		select {
		case <-w.wake:
		case <-poll.C:
			if q.isHead(key, w) {
				q.dispatch(key)
			}
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

// dispatch admits the first waiter of the partition's line, in class and
// arrival order, some of whose workers are not busy, unless an admitted
// one has not booked yet (settled). One busy check is asked per scope.
func (q *overloadQueue) dispatch(key selection.PartitionKey) {
	q.mu.Lock()
	defer q.mu.Unlock()
	line := q.lines[key]
	if line == nil || line.n == 0 || q.closed {
		return
	}
	now := q.now()
	if !line.admitting.IsZero() && now.Sub(line.admitting) < headPoll {
		return // the last one let on has not booked yet
	}
	var busyScopes []lineScope
	for _, c := range line.classes {
		for _, w := range c {
			if slices.Contains(busyScopes, w.req.scope) {
				continue
			}
			if busy, _ := q.busy(w.req.part, w.req.placement); busy {
				busyScopes = append(busyScopes, w.req.scope)
				continue
			}
			line.remove(w)
			w.admitted = true
			line.admitting = now
			line.noteAdmission(now)
			signal(w)
			return
		}
	}
}

// settled says the request last admitted from the partition's line has
// booked its worker (or failed to): the next may be admitted.
func (q *overloadQueue) settled(key selection.PartitionKey) {
	q.mu.Lock()
	if line := q.lines[key]; line != nil {
		line.admitting = time.Time{}
	}
	q.mu.Unlock()
	q.dispatch(key)
}

// isAdmitted reports whether dispatch let w on.
func (q *overloadQueue) isAdmitted(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return w.admitted
}

// noteClear remembers that the partition was not busy at now.
func (q *overloadQueue) noteClear(key selection.PartitionKey, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.lineLocked(key).clearUntil = now.Add(q.clearFor)
}

// forgetClear drops the partition's not-busy answer: a booking found
// every worker full.
func (q *overloadQueue) forgetClear(key selection.PartitionKey) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if line := q.lines[key]; line != nil {
		line.clearUntil = time.Time{}
	}
}

// lineLocked is the partition's line, made when missing. q.mu is held.
func (q *overloadQueue) lineLocked(key selection.PartitionKey) *waitLine {
	line := q.lines[key]
	if line == nil {
		line = &waitLine{classes: make([][]*waiter, len(q.s.classes))}
		q.lines[key] = line
	}
	return line
}

// enqueue puts w at the end of its class, or says why it may not wait.
func (q *overloadQueue) enqueue(key selection.PartitionKey, w *waiter, now time.Time) shedReason {
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
	if line.n == 0 {
		line.waitingSince = now
	}
	line.classes[w.class] = append(line.classes[w.class], w)
	line.n++
	return ""
}

// noteAdmission records an admission at now: the time since the later of
// the admission before and the line's last start from empty, which is how
// long the workers took to free a place while someone waited for one.
// Measured from the admission before alone, on sparse traffic (the line
// empty between requests) the gaps were the clients' pauses: requests
// 2.7 s apart on one worker, each waiting 0.2 s, made a rate of 0.37 a
// second, and a newcomer was refused as one that would wait 2.7 s.
// Counting only the gaps with a waiter left all through them instead
// dropped, under overload, the places freed soon after the line emptied:
// the rate came out high, newcomers waited out max_wait (98.1 % of make
// overload's 429s within 100 ms, against 100 %).
func (l *waitLine) noteAdmission(now time.Time) {
	start := l.lastAdmit
	if l.waitingSince.After(start) {
		start = l.waitingSince
	}
	if !start.IsZero() {
		l.gaps[l.nGaps%rateWindow] = now.Sub(start)
		l.nGaps++
	}
	l.lastAdmit = now
}

// rate is the line's admissions per second over its latest rateWindow
// gaps (noteAdmission); 0 (unknown) with fewer than 7 of them, or when the
// latest admission is older than maxWait (the line was idle, and its past
// rate says nothing of now).
func (l *waitLine) rate(now time.Time, maxWait time.Duration) float64 {
	n := min(l.nGaps, rateWindow)
	if n < 7 || now.Sub(l.lastAdmit) > maxWait {
		return 0
	}
	var span time.Duration
	for _, g := range l.gaps[:n] {
		span += g
	}
	if span <= 0 {
		return 0
	}
	return float64(n) / span.Seconds()
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

func (q *overloadQueue) isHead(key selection.PartitionKey, w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	line := q.lines[key]
	return line != nil && line.head() == w
}

func (q *overloadQueue) isClosed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}

// leave takes a waiter out of its line and reports why, unless dispatch
// let it on meanwhile: then it goes on.
func (q *overloadQueue) leave(key selection.PartitionKey, w *waiter, start time.Time, why shedReason) admission {
	q.mu.Lock()
	admitted := w.admitted
	if line := q.lines[key]; line != nil && !admitted {
		line.remove(w)
	}
	q.mu.Unlock()
	if admitted {
		return admission{queued: true, waited: q.now().Sub(start)}
	}
	return admission{queued: true, waited: q.now().Sub(start), shed: why}
}

// kick looks for a waiter to admit: a worker may have capacity (a
// booking freed, a prefill completed).
func (q *overloadQueue) kick(key selection.PartitionKey) {
	q.dispatch(key)
}

// close refuses every waiting and later request (Cleanup).
func (q *overloadQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	for _, line := range q.lines {
		for _, c := range line.classes {
			for _, w := range c {
				signal(w)
			}
		}
	}
}

// depth is the number of requests waiting for a partition.
func (q *overloadQueue) depth(key selection.PartitionKey) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if line := q.lines[key]; line != nil {
		return line.n
	}
	return 0
}

func signal(w *waiter) {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}
