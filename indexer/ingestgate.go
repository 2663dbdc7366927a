package indexer

import (
	"runtime"
	"sync"
	"time"
)

// Ingest's share of the cores.
//
// Go's scheduler has no priorities: when more goroutines have payloads
// to decode and apply than there are cores, all of them are runnable at
// once, and a request's goroutine, woken by the network poller, queues
// behind them on a core. So at most IngestCores goroutines decode and
// apply at once; the others wait their turn parked, not runnable, and a
// request finds a core. Those goroutines are the ingest loops (one per
// ingest core, each receiving for many listeners, ingestloop.go), a
// replay's goroutine while it applies what it fetched, and the reader of
// each bind-mode publisher (bindpeer.go). (Before the loops, every listener had a goroutine of its
// own: behind 1,024 publishers sending as fast as the gateway applies,
// on two cores shared with the publishers, the turns took a lookup served
// over HTTP from 11-16 ms at p99 to 8-9 ms, with 1-4 ms with ingest idle;
// BenchmarkIngestFleetProcess, LOOKUP_OVER=http; BENCHMARKS.md.) What
// waits meanwhile is bounded as before: a loop holds the one message it
// received, the rest stay in its sockets' queues (subQueue), and a
// publisher that falls behind shows in kv_events.behind. A KV event is a
// routing hint; a request is the gateway's job.

// defaultIngestCores is IngestCores when unset: every core but one, at
// least one.
func defaultIngestCores() int { return max(1, runtime.GOMAXPROCS(0)-1) }

// ingestCores is IngestCores, or its default when unset.
func (x *Index) ingestCores() int {
	if x.IngestCores > 0 {
		return x.IngestCores
	}
	return defaultIngestCores()
}

// ingestGate holds the turns: a slot per core ingest may use.
type ingestGate struct {
	once  sync.Once
	slots chan struct{}
}

// enterIngest waits for a turn to decode and apply a payload; leaveIngest
// ends it.
func (x *Index) enterIngest() {
	x.ingest.once.Do(func() { x.ingest.slots = make(chan struct{}, x.ingestCores()) })
	x.ingest.slots <- struct{}{}
}

func (x *Index) leaveIngest() { <-x.ingest.slots }

// ingestTurn is one reading goroutine's hold on a turn. Taking and giving
// back a turn for every payload parks and wakes a goroutine per payload
// once goroutines contend, which cost 20-50 % more CPU per block at 1,024
// publishers (when each listener had its own); a goroutine keeps its turn
// across the payloads it finds waiting, for up to turnSlice, and gives it
// back before it waits for more (or for a replay's reply). Only its
// goroutine uses it.
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
