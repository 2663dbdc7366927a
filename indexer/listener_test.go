package indexer

import (
	"net"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/goleak"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const lbs = 4 // block size of the listener tests

// fixture is an index, a publisher and a listener following it.
type fixture struct {
	t     *testing.T
	zctx  *zmq.Context
	index *Index
	stats *Stats
	pub   *testPublisher
	lis   *Listener
	rank  selection.Rank
	// timeout is the listener's replay timeout (0: the default).
	timeout time.Duration
	// cfg adjusts the listener's config before it starts (nil: as is).
	cfg func(*ListenerConfig)
}

func newFixture(t *testing.T, withReplay, subscribeFirst bool) *fixture {
	return newFixtureTimeout(t, withReplay, subscribeFirst, 0)
}

func newFixtureTimeout(t *testing.T, withReplay, subscribeFirst bool, replayTimeout time.Duration) *fixture {
	t.Helper()
	return newFixtureOn(t, withReplay, subscribeFirst, replayTimeout, "127.0.0.1")
}

// newFixtureOn is a fixture whose publisher is bound on host.
func newFixtureOn(t *testing.T, withReplay, subscribeFirst bool, replayTimeout time.Duration, host string) *fixture {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, zctx: zctx, index: New(), stats: new(Stats), rank: selection.Rank{WorkerID: 9}, timeout: replayTimeout}
	f.index.ConfigurePartition(part, lbs, false)
	f.pub = newTestPublisherOn(t, zctx, withReplay, host)
	if subscribeFirst {
		f.listen()
	}
	t.Cleanup(func() {
		if f.lis != nil {
			f.lis.Stop()
		}
		f.pub.close()
		_ = zctx.Term()
	})
	return f
}

func (f *fixture) listen() {
	cfg := ListenerConfig{Endpoint: f.pub.pubEP, Replay: f.pub.replay, Partition: part, Rank: f.rank, ReplayTimeout: f.timeout}
	if f.cfg != nil {
		f.cfg(&cfg)
	}
	var err error
	f.lis, err = StartListener(f.zctx, f.index, f.stats, nil, cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	f.pub.waitSubscribed()
}

// chunk is a payload storing blocks [from, to) of prompt, stamped now.
func chunk(enc Encoding, dpRank int, prompt []uint32, from, to int) []byte {
	return chunkAt(enc, dpRank, prompt, from, to, float64(time.Now().Unix()))
}

// chunkAt is chunk with the publisher's stamp ts (seconds).
func chunkAt(enc Encoding, dpRank int, prompt []uint32, from, to int, ts float64) []byte {
	ev := &StoredBlocks{BlockSize: lbs, TokenIDs: prompt[from*lbs : to*lbs]}
	if from > 0 {
		h := engineHash(prompt[:from*lbs])
		ev.Parent = &h
	}
	for b := from; b < to; b++ {
		ev.BlockHashes = append(ev.BlockHashes, engineHash(prompt[:(b+1)*lbs]))
	}
	return AppendBatch(nil, enc, ts, dpRank, ev)
}

func testPrompt(salt uint32) []uint32 {
	p := make([]uint32, 40*lbs)
	for i := range p {
		p[i] = uint32(i)*7 + salt
	}
	return p
}

func (f *fixture) depth(r selection.Rank, prompt []uint32) uint32 {
	return depthAt(f.index, part, lbs, r, prompt)
}

func (f *fixture) waitBatches(n uint64) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for f.stats.Batches.Load() < n {
		if time.Now().After(deadline) {
			s := f.stats
			f.t.Fatalf("timed out waiting for %d batches applied: batches %d, messages %d, gaps %d, replays %d, replayed %d, lost %d, stale %d, restarts %d, malformed %d, rejected %d",
				n, s.Batches.Load(), s.Messages.Load(), s.Gaps.Load(), s.Replays.Load(), s.Replayed.Load(), s.Lost.Load(),
				s.Stale.Load(), s.Restarts.Load(), s.Malformed.Load(), s.Rejected.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestListenerAppliesBothEncodingsAndRanks(t *testing.T) {
	f := newFixture(t, false, true)
	prompt := testPrompt(1)
	f.pub.publish(chunk(EncodingArray, -1, prompt, 0, 10), true)
	f.pub.publish(chunk(EncodingMap, 0, prompt, 10, 20), true)
	f.pub.publish(chunk(EncodingMap, 3, prompt, 0, 5), true) // the payload's dp_rank wins
	f.waitBatches(3)
	if d := f.depth(f.rank, prompt); d != 20 {
		t.Fatalf("rank 0 depth %d, want 20", d)
	}
	if d := f.depth(selection.Rank{WorkerID: 9, DPRank: 3}, prompt); d != 5 {
		t.Fatalf("rank 3 depth %d, want 5", d)
	}
	if f.stats.Gaps.Load() != 0 || f.stats.Malformed.Load() != 0 {
		t.Fatalf("stats: gaps %d malformed %d", f.stats.Gaps.Load(), f.stats.Malformed.Load())
	}
}

// A publisher on an IPv6 address is followed, and replays to the
// listener, like one on IPv4.
func TestListenerOverIPv6(t *testing.T) {
	f := newFixtureOn(t, true, true, 0, "[::1]")
	prompt := testPrompt(3)
	f.pub.publish(chunk(EncodingMap, 0, prompt, 0, 10), true)
	f.pub.publish(chunk(EncodingMap, 0, prompt, 10, 20), false) // lost on the way: replayed
	f.pub.publish(chunk(EncodingMap, 0, prompt, 20, 30), true)
	f.waitBatches(3)
	if d := f.depth(f.rank, prompt); d != 30 {
		t.Fatalf("depth %d over IPv6, want 30", d)
	}
}

func TestListenerReplaysGaps(t *testing.T) {
	for _, topicReplies := range []bool{false, true} {
		f := newFixture(t, true, false)
		f.pub.topicRepl = topicReplies
		f.listen()
		prompt := testPrompt(2)
		f.pub.publish(chunk(EncodingMap, 0, prompt, 0, 5), true)
		f.pub.publish(chunk(EncodingMap, 0, prompt, 5, 10), false) // lost on the wire
		f.pub.publish(chunk(EncodingMap, 0, prompt, 10, 15), false)
		f.pub.publish(chunk(EncodingMap, 0, prompt, 15, 20), true)
		f.waitBatches(4)
		if d := f.depth(f.rank, prompt); d != 20 {
			t.Fatalf("depth %d after replay, want 20", d)
		}
		if f.stats.Gaps.Load() != 1 || f.stats.Replays.Load() != 1 || f.stats.Replayed.Load() != 2 || f.stats.Lost.Load() != 0 {
			t.Fatalf("stats: gaps %d replays %d replayed %d lost %d", f.stats.Gaps.Load(), f.stats.Replays.Load(),
				f.stats.Replayed.Load(), f.stats.Lost.Load())
		}
	}
}

func TestListenerGapWithoutReplay(t *testing.T) {
	f := newFixture(t, false, true)
	prompt := testPrompt(3)
	f.pub.publish(chunk(EncodingArray, 0, prompt, 0, 5), true)
	f.pub.publish(chunk(EncodingArray, 0, prompt, 5, 10), false)
	f.pub.publish(chunk(EncodingArray, 0, prompt, 10, 15), true) // its parent never arrived
	other := testPrompt(4)
	f.pub.publish(chunk(EncodingArray, 0, other, 0, 8), true)
	f.waitBatches(3)
	if f.stats.Lost.Load() != 1 || f.stats.Gaps.Load() != 1 || f.stats.Rejected.Load() != 1 {
		t.Fatalf("lost %d gaps %d rejected %d", f.stats.Lost.Load(), f.stats.Gaps.Load(), f.stats.Rejected.Load())
	}
	// The index stays usable: what arrived whole is there.
	if f.depth(f.rank, prompt) != 5 || f.depth(f.rank, other) != 8 {
		t.Fatalf("depths %d, %d", f.depth(f.rank, prompt), f.depth(f.rank, other))
	}
}

func TestListenerLateJoinReplaysFromZero(t *testing.T) {
	f := newFixture(t, true, false)
	prompt := testPrompt(5)
	for i := range 4 { // published before anyone listens
		f.pub.publish(chunk(EncodingMap, 0, prompt, i*5, i*5+5), false)
	}
	f.listen()
	f.pub.publish(chunk(EncodingMap, 0, prompt, 20, 25), true)
	f.waitBatches(5)
	if d := f.depth(f.rank, prompt); d != 25 {
		t.Fatalf("depth %d after late join, want 25", d)
	}
	if f.stats.Lost.Load() != 0 || f.stats.Replayed.Load() != 4 {
		t.Fatalf("lost %d replayed %d", f.stats.Lost.Load(), f.stats.Replayed.Load())
	}
}

func TestListenerDetectsRestart(t *testing.T) {
	f := newFixture(t, true, true)
	old, fresh := testPrompt(6), testPrompt(7)
	for i := range 3 {
		f.pub.publish(chunk(EncodingMap, 0, old, i*5, i*5+5), true)
	}
	f.waitBatches(3)
	if f.depth(f.rank, old) != 15 {
		t.Fatal("old prompt not indexed")
	}
	f.pub.restart() // a new engine process: sequence 0 again, empty cache
	f.pub.publish(chunk(EncodingMap, 0, fresh, 0, 5), true)
	f.waitBatches(4)
	if f.stats.Restarts.Load() != 1 {
		t.Fatalf("restarts %d", f.stats.Restarts.Load())
	}
	if f.depth(f.rank, old) != 0 || f.depth(f.rank, fresh) != 5 {
		t.Fatalf("after restart: old %d (want 0), fresh %d (want 5)", f.depth(f.rank, old), f.depth(f.rank, fresh))
	}
}

func TestListenerSkipsMalformed(t *testing.T) {
	f := newFixture(t, false, true)
	prompt := testPrompt(8)
	f.pub.raw([]byte("topic"), []byte{1, 2, 3})                    // two frames
	f.pub.raw([]byte{}, []byte{0, 0, 0, 0, 0, 0, 0}, []byte{0x90}) // 7-byte sequence
	f.pub.publish([]byte{0xc1, 0xff, 0x00}, true)                  // not msgpack
	f.pub.publish(chunk(EncodingMap, 0, prompt, 0, 5), true)
	f.waitBatches(1)
	if f.stats.Malformed.Load() != 3 {
		t.Fatalf("malformed %d, want 3", f.stats.Malformed.Load())
	}
	if f.depth(f.rank, prompt) != 5 {
		t.Fatal("a good batch after bad ones was not applied")
	}
}

func TestListenerReplayTimeout(t *testing.T) {
	f := newFixtureTimeout(t, true, false, 200*time.Millisecond)
	f.pub.silent = true
	f.listen()
	prompt := testPrompt(9)
	f.pub.publish(chunk(EncodingMap, 0, prompt, 0, 5), true)
	f.pub.publish(chunk(EncodingMap, 0, prompt, 5, 10), false)
	f.pub.publish(chunk(EncodingMap, 0, testPrompt(10), 0, 5), true)
	f.waitBatches(2)
	if f.stats.Lost.Load() != 1 || f.stats.Replays.Load() != 1 {
		t.Fatalf("lost %d replays %d", f.stats.Lost.Load(), f.stats.Replays.Load())
	}
	if f.depth(f.rank, prompt) != 5 || f.depth(f.rank, testPrompt(10)) != 5 {
		t.Fatal("index not usable after a replay timeout")
	}
}

// TestListenerConnectsLate: the publisher's endpoint is down when the
// listener starts and comes up later; libzmq's reconnect brings the events
// in without anything restarted.
func TestListenerConnectsLate(t *testing.T) {
	// A free port, released so that nothing listens there yet.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep := "tcp://" + ln.Addr().String()
	ln.Close()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	x := New()
	x.ConfigurePartition(part, lbs, false)
	var stats Stats
	l, err := StartListener(zctx, x, &stats, nil, ListenerConfig{Endpoint: ep, Partition: part, Rank: selection.Rank{WorkerID: 4}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // a few failed reconnects
	pub, _ := zctx.NewSocket(zmq.XPUB)
	_ = pub.SetLinger(0)
	_ = pub.SetRcvtimeo(10 * time.Second)
	if err := pub.Bind(ep); err != nil {
		t.Skipf("could not rebind %s: %v", ep, err)
	}
	if _, err := pub.RecvBytes(0); err != nil {
		t.Fatalf("the listener never connected: %v", err)
	}
	var s [8]byte
	if _, err := pub.SendMessage([]byte{}, s[:], chunk(EncodingMap, 0, testPrompt(13), 0, 6)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the late publisher's events", func() bool { return stats.Batches.Load() == 1 })
	if n := x.Blocks(part, selection.Rank{WorkerID: 4}); n != 6 {
		t.Fatalf("%d blocks indexed, want 6", n)
	}
	l.Stop()
	pub.Close()
	_ = zctx.Term()
}

// A listener whose endpoint cannot be connected to is an error at start,
// not a listener that silently hears nothing (the connect error was
// shadowed and dropped).
func TestStartListenerReportsConnectError(t *testing.T) {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = zctx.Term() }()
	l, err := StartListener(zctx, New(), new(Stats), nil, ListenerConfig{Endpoint: "tcp://no port here", Partition: part})
	if err == nil {
		l.Stop()
		t.Fatal("a listener started on an endpoint libzmq cannot connect to")
	}
}

// TestListenerCountsBatchesAppliedBehind: batches are stamped with the
// publisher's clock; one that arrives well after what its predecessors'
// stamps set as the baseline counts as behind, one within the jitter does
// not, and a replayed batch (old by design) never does.
func TestListenerCountsBatchesAppliedBehind(t *testing.T) {
	f := newFixture(t, true, true)
	prompt := testPrompt(21)
	stamped := func(from, to int, ts float64) []byte { return chunkAt(EncodingMap, 0, prompt, from, to, ts) }
	now := func() float64 { return float64(time.Now().UnixNano()) / 1e9 }
	// The publisher's clock runs an hour ahead of ours: only the
	// difference from the baseline counts, not the offset.
	const ahead = 3600.0
	f.pub.publish(stamped(0, 2, now()+ahead), true)
	f.pub.publish(stamped(2, 4, now()+ahead-0.5), true) // half a second late: jitter
	f.waitBatches(2)
	if got := f.stats.Behind.Load(); got != 0 {
		t.Fatalf("behind %d after on-time batches, want 0", got)
	}
	f.pub.publish(stamped(4, 6, now()+ahead-behindAfter-1), true) // 3 s late
	f.waitBatches(3)
	if got := f.stats.Behind.Load(); got != 1 {
		t.Fatalf("behind %d after a batch 3 s late, want 1", got)
	}
	// A gap: the missed batch comes back by replay with its old stamp.
	f.pub.publish(stamped(6, 8, now()+ahead-60), false)
	f.pub.publish(stamped(8, 10, now()+ahead), true)
	f.waitBatches(5)
	if got := f.stats.Behind.Load(); got != 1 {
		t.Fatalf("behind %d after a replayed old batch, want still 1", got)
	}
	if f.depth(f.rank, prompt) != 10 {
		t.Fatal("the batches were not all applied")
	}
}

// A stop and a poke both pending when the receive loop comes round (a
// poke's interrupted wait rearmed, undoing the stop's interrupt): the
// loop must stop. Taking the poke instead, it would go on to wait on a
// socket with nothing to wake it. select picks among ready cases at
// random, so each of twenty rounds catches that half the time.
func TestReceiveStopsBeforeAPoke(t *testing.T) {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = zctx.Term() }()
	for round := range 20 {
		if pokes, stopped := receiveStopAndPoke(t, zctx); !stopped || pokes != 0 {
			t.Fatalf("round %d: stopped %v after %d pokes; want a stop before any poke", round, stopped, pokes)
		}
	}
}

// receiveStopAndPoke runs receive on a fresh SUB with its stop closed and
// a poke pending, and reports how many pokes it handled and whether it
// returned by itself (within two seconds; after that it is interrupted).
func receiveStopAndPoke(t *testing.T, zctx *zmq.Context) (pokes int, stopped bool) {
	sub, err := zctx.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Close() }()
	w, err := newReadWait(sub)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	stop, poke := make(chan struct{}), make(chan struct{}, 1)
	close(stop)
	poke <- struct{}{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		receive(sub, w, stop, poke, func() { pokes++ }, new(Stats), func([]byte, uint64, []byte) {}, func() {})
	}()
	select {
	case <-done:
		return pokes, true
	case <-time.After(2 * time.Second):
		w.interrupt() // the loop then finds the stop
		<-done
		return pokes, false
	}
}
