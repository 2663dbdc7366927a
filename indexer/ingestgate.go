package indexer

import (
	"runtime"
	"sync"
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
// publishers, a lookup served over HTTP went from 14-16 ms at p99 to
// 11-13 ms (1-3 ms with ingest idle) at the same ingest rate
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
