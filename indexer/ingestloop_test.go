package indexer

import (
	"net"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// loopFleet is n publishers, each followed by a listener on x.
type loopFleet struct {
	t         *testing.T
	x         *Index
	zctx      *zmq.Context
	pubs      []*testPublisher
	listeners []*Listener
	stats     []Stats
}

// newLoopFleet starts the fleet; adjust, when given, changes listener i's
// config before it starts.
func newLoopFleet(t *testing.T, x *Index, n int, adjust func(i int, cfg *ListenerConfig)) *loopFleet {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	f := &loopFleet{t: t, x: x, zctx: zctx, stats: make([]Stats, n)}
	t.Cleanup(func() {
		for _, l := range f.listeners {
			l.Stop()
		}
		for _, p := range f.pubs {
			p.close()
		}
		_ = zctx.Term()
	})
	for i := range n {
		p := newTestPublisherOn(t, zctx, false, "127.0.0.1")
		f.pubs = append(f.pubs, p)
		cfg := ListenerConfig{Endpoint: p.pubEP, Partition: part, Rank: selection.Rank{WorkerID: uint64(i + 1)}}
		if adjust != nil {
			adjust(i, &cfg)
		}
		l, err := StartListener(zctx, x, &f.stats[i], nil, cfg)
		if err != nil {
			t.Fatal(err)
		}
		f.listeners = append(f.listeners, l)
	}
	for _, p := range f.pubs {
		p.waitSubscribed()
	}
	return f
}

// publishAll has publishers [from, to) each store the next ten blocks of
// their own prompt, and waits until every listener has applied them.
func (f *loopFleet) publishAll(from, to int, round int) {
	f.t.Helper()
	for i := from; i < to; i++ {
		f.pubs[i].publish(chunk(EncodingArray, -1, testPrompt(uint32(i)), 10*round, 10*round+10), true)
	}
	for i := from; i < to; i++ {
		eventually(f.t, "every listener applied its batch", func() bool { return f.stats[i].Batches.Load() == uint64(round+1) })
	}
}

// loopIndex returns an index whose ingest uses at most cores loops, with
// the listener tests' partition configured.
func loopIndex(cores int) *Index {
	x := New()
	x.IngestCores = cores
	x.ConfigurePartition(part, lbs, false)
	return x
}

// stopsWithin stops l and fails with why unless Stop returns within d.
func stopsWithin(t *testing.T, l *Listener, d time.Duration, why string) {
	t.Helper()
	stopped := make(chan struct{})
	go func() { l.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(d):
		t.Fatal(why)
	}
}

// loopCounts returns the index's loops' member counts.
func loopCounts(x *Index) []int {
	x.loops.mu.Lock()
	defer x.loops.mu.Unlock()
	var n []int
	for _, p := range x.loops.loops {
		n = append(n, p.members)
	}
	return n
}

// One loop receives for every listener of a one-core index: listeners
// join and leave it while it runs, it ends with the last, and the next
// listener starts a new one.
func TestIngestLoopServesManyListeners(t *testing.T) {
	x := loopIndex(1)
	const n = 40
	f := newLoopFleet(t, x, n, nil)
	if got := loopCounts(x); len(got) != 1 || got[0] != n {
		t.Fatalf("loops' members %v, want [%d]", got, n)
	}
	f.publishAll(0, n, 0)
	for i := range n / 2 {
		f.listeners[i].Stop()
	}
	if got := loopCounts(x); len(got) != 1 || got[0] != n/2 {
		t.Fatalf("after half stopped, loops' members %v, want [%d]", got, n/2)
	}
	f.publishAll(n/2, n, 1)
	for _, l := range f.listeners {
		l.Stop()
	}
	eventually(t, "the loop ended with its last listener", func() bool { return len(loopCounts(x)) == 0 })
	for i := range n {
		if d := depthAt(x, part, lbs, selection.Rank{WorkerID: uint64(i + 1)}, testPrompt(uint32(i))); d != 10 && d != 20 {
			t.Fatalf("listener %d: depth %d", i, d)
		}
	}

	again := newLoopFleet(t, x, 1, nil)
	if got := loopCounts(x); len(got) != 1 || got[0] != 1 {
		t.Fatalf("a listener after the loop ended: loops' members %v, want [1]", got)
	}
	again.publishAll(0, 1, 0)
}

// With two ingest cores, listeners are spread over two loops.
func TestIngestLoopsShareTheListeners(t *testing.T) {
	x := loopIndex(2)
	f := newLoopFleet(t, x, 5, nil)
	if got := loopCounts(x); len(got) != 2 || got[0]+got[1] != 5 || got[0] < 2 || got[1] < 2 {
		t.Fatalf("loops' members %v, want 5 over two loops", got)
	}
	f.publishAll(0, 5, 0)
}

// Stopping a listener whose replay is under way (handed off the loop)
// ends the replay and closes the socket promptly, long before the
// replay's timeout, and leaves the loop serving the others.
func TestStopDuringAReplay(t *testing.T) {
	deaf, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deaf.Close() })
	x := loopIndex(1)
	f := newLoopFleet(t, x, 2, func(i int, cfg *ListenerConfig) {
		if i == 0 {
			cfg.Replay, cfg.ReplayTimeout = "tcp://"+deaf.Addr().String(), 30*time.Second
		}
	})
	f.publishAll(0, 2, 0)
	f.pubs[0].jumpTo(5)
	f.pubs[0].publish(chunk(EncodingArray, -1, testPrompt(0), 10, 20), true)
	eventually(t, "replay under way", func() bool { return f.stats[0].Replays.Load() == 1 })

	stopsWithin(t, f.listeners[0], 5*time.Second, "Stop still waits 5 s into a 30 s replay")
	if got := loopCounts(x); len(got) != 1 || got[0] != 1 {
		t.Fatalf("loops' members %v after one of two stopped, want [1]", got)
	}
	f.publishAll(1, 2, 1)
}

// needsReplay, which decides what a loop hands off, says yes exactly
// when deliver replays: for every kind of cursor (not started, in step,
// after a replay overtook the live stream) and every kind of sequence
// (repeat, restart, in order, gap, jump past MaxGap).
func TestNeedsReplayAgreesWithDeliver(t *testing.T) {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nobody := "tcp://" + ln.Addr().String() // closed: a replay's send times out at once
	ln.Close()
	x := New()
	x.ConfigurePartition(part, lbs, false)
	payload := chunk(EncodingArray, -1, testPrompt(1), 0, 2)
	cursors := []cursor{{}, {started: true}}
	for _, last := range []uint64{0, 5, 40} {
		cursors = append(cursors, cursor{started: true, last: last, lastLive: last}, cursor{started: true, last: last + 3, lastLive: last})
	}
	for _, replay := range []string{nobody, ""} {
		for _, c := range cursors {
			for _, seq := range []uint64{0, 1, 2, 4, 5, 6, 7, 8, 9, 40, 41, 43, 44, 45, 60, 1_000_000} {
				var stats Stats
				cfg := ListenerConfig{Replay: replay, ReplayTimeout: time.Millisecond, Partition: part,
					Rank: selection.Rank{WorkerID: 1}, MaxGap: 30}
				st := &stream{cfg: cfg, zctx: zctx, index: x, stats: &stats, log: zap.NewNop(), stop: make(chan struct{}),
					turn: &ingestTurn{x: x}, cur: c}
				want := st.needsReplay(seq)
				st.deliver(seq, payload)
				st.turn.leave()
				if got := stats.Replays.Load() > 0; got != want {
					t.Errorf("replay %q, cursor %+v, seq %d: deliver replayed %v, needsReplay said %v", replay, c, seq, got, want)
				}
			}
		}
	}
}

// However asks race the loop reading its doorbell, the loop hears the
// next one: after many asks from several goroutines at once (each a
// no-op), Stop, one more ask, still returns.
func TestIngestLoopHearsAsksAfterARace(t *testing.T) {
	x := loopIndex(1)
	f := newLoopFleet(t, x, 2, nil)
	p := f.listeners[0].loop
	for round := range 4 { // publishAll stores ten of a prompt's 40 blocks a round
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 5000 {
					p.ask(askJoin, nil) // nil: no listener, a no-op the loop takes
				}
			})
		}
		wg.Wait()
		f.publishAll(1, 2, round) // the loop has taken the asks and parked since
	}
	stopsWithin(t, f.listeners[0], 10*time.Second, "Stop's ask was not heard: the doorbell stayed rung")
}
