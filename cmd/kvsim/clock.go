package main

import (
	"container/heap"
	"time"
)

// clock is the simulation's virtual time and its queue of events. Events
// at the same instant run in the order they were scheduled, so a run
// depends on nothing but its inputs and seed.
type clock struct {
	now    time.Duration
	queue  eventHeap
	serial uint64
}

// event is an action due at a virtual instant.
type event struct {
	at     time.Duration
	serial uint64
	fn     func()
}

type eventHeap []*event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].serial < h[j].serial
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}

// at schedules fn at virtual time t (now, if t is in the past).
func (c *clock) at(t time.Duration, fn func()) {
	c.serial++
	heap.Push(&c.queue, &event{at: max(t, c.now), serial: c.serial, fn: fn})
}

// after schedules fn d from now.
func (c *clock) after(d time.Duration, fn func()) { c.at(c.now+d, fn) }

// run executes events in time order until none is left or the next one is
// due after end; now is then end.
func (c *clock) run(end time.Duration) {
	for len(c.queue) > 0 && c.queue[0].at <= end {
		e := heap.Pop(&c.queue).(*event)
		c.now = e.at
		e.fn()
	}
	c.now = end
}
