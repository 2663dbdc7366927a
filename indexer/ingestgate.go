package indexer

import (
	"runtime"
	"sync"
	"time"
)

// Ingest's share of the cores.
//
// Every publisher has its own listener goroutine, and Go's scheduler has
// no priorities: when more listeners have messages waiting than there
// are cores, all of them are runnable at once, and a request's goroutine,
// woken by the network poller, queues behind them on a core. So at most
// IngestCores listeners decode and apply at once; the others wait their
// turn parked, not runnable, and a request finds a core. (The write lock
// already let one listener apply at a time; decoding, hashing and the
// wait for the lock ran on every core.) Behind 1,024 publishers sending
// as fast as the gateway applies, on two cores shared with the
// publishers, a lookup served over HTTP went from 11-16 ms at p99 to
// 8-9 ms (1-4 ms with ingest idle); ingest, decoding on one core of the
// two, ran within 10 % of its rate, or at half in the quietest run
// (BenchmarkIngestFleetProcess, LOOKUP_OVER=http; BENCHMARKS.md). What
// waits meanwhile is bounded as before: a listener holds the one message
// it received, the rest stay in its socket's queue (subQueue), and a
// publisher that falls behind shows in kv_events.behind. A KV event is a
// routing hint; a request is the gateway's job.

// defaultIngestCores is IngestCores when unset: every core but one, at
// least one.
func defaultIngestCores() int { return max(1, runtime.GOMAXPROCS(0)-1) }

// ingestGate holds the turns: a slot per core ingest may use.
type ingestGate struct {
	once  sync.Once
	slots chan struct{}
}

// enterIngest waits for a turn to decode and apply a payload; leaveIngest
// ends it.
func (x *Index) enterIngest() {
	x.ingest.once.Do(func() {
		n := x.IngestCores
		if n <= 0 {
			n = defaultIngestCores()
		}
		x.ingest.slots = make(chan struct{}, n)
	})
	x.ingest.slots <- struct{}{}
}

func (x *Index) leaveIngest() { <-x.ingest.slots }

// ingestTurn is one reading goroutine's hold on a turn. Taking and giving
// back a turn for every payload parks and wakes a goroutine per payload
// once listeners contend, which cost 20-50 % more CPU per block at 1,024
// publishers; a goroutine keeps its turn across the payloads it finds
// waiting, for up to turnSlice, and gives it back before it waits for
// more (or for a replay's reply). Only its goroutine uses it.
type ingestTurn struct {
	x     *Index
	held  bool
	since time.Time
}

// turnSlice is how long a goroutine keeps a turn while payloads keep
// coming: a few payloads' decoding and applying, short beside the wait
// it may put on a request.
const turnSlice = 100 * time.Microsecond

// enter takes a turn unless one is held.
func (t *ingestTurn) enter() {
	if !t.held {
		t.x.enterIngest()
		t.held, t.since = true, time.Now()
	}
}

// pace gives the turn back once it has been held for turnSlice.
func (t *ingestTurn) pace() {
	if t.held && time.Since(t.since) >= t.x.turnHold {
		t.leave()
	}
}

// leave gives the turn back.
func (t *ingestTurn) leave() {
	if t.held {
		t.x.leaveIngest()
		t.held = false
	}
}
