package indexer

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// gatherCounts returns how many times the index's only loop started and
// stopped gathering.
func gatherCounts(t *testing.T, x *Index) (started, stopped uint64) {
	t.Helper()
	x.loops.mu.Lock()
	defer x.loops.mu.Unlock()
	if len(x.loops.loops) != 1 {
		t.Fatalf("%d loops, want 1", len(x.loops.loops))
	}
	p := x.loops.loops[0]
	return p.gathers.Load(), p.ungathers.Load()
}

// A loop whose listeners' messages come less than a window apart gathers
// them, applies every one, and goes back to waiting on edges once they
// stop: a message sent after that still wakes it. (Were the inner set
// not put back in the outer's interest, the last message would never be
// applied.)
func TestIngestLoopGathersAndWakesAfter(t *testing.T) {
	x := loopIndex(1)
	const n = 4
	f := newLoopFleet(t, x, n, nil)
	prompts := make([][]uint32, n)
	for i := range prompts {
		prompts[i] = testPrompt(uint32(i))
	}

	// Single messages, one publisher after another, at gaps of 0, 100,
	// 200 and 400 µs in turn: whatever a message costs this machine, some
	// gap lets the loop park and wakes it again within the window.
	sent := make([]int, n)
	deadline := time.Now().Add(20 * time.Second)
	for k := 0; ; k++ {
		if started, _ := gatherCounts(t, x); started > 0 && k >= 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the loop never started gathering")
		}
		i := k % n
		b := sent[i] % 40 // storing a held block again is a valid event
		f.pubs[i].publish(chunk(EncodingArray, -1, prompts[i], b, b+1), true)
		sent[i]++
		if gap := k % 4; gap > 0 {
			spin(time.Duration(50<<gap) * time.Microsecond)
		}
	}
	for i := range n {
		eventually(t, "every message applied", func() bool { return f.stats[i].Batches.Load() == uint64(sent[i]) })
	}
	eventually(t, "the loop stopped gathering", func() bool {
		started, stopped := gatherCounts(t, x)
		return started == stopped
	})

	f.pubs[0].publish(chunk(EncodingArray, -1, prompts[0], 0, 1), true)
	eventually(t, "a message after the loop stopped gathering is applied", func() bool {
		return f.stats[0].Batches.Load() == uint64(sent[0]+1)
	})
	for i := range n {
		if d := depthAt(x, part, lbs, selection.Rank{WorkerID: uint64(i + 1)}, prompts[i]); d != uint32(min(sent[i], 40)) {
			t.Fatalf("listener %d: depth %d after %d messages", i, d, sent[i])
		}
	}
}

// A listener stopped while its loop gathers is let go (a gathering loop
// takes its asks at every look, though it does not listen to its
// doorbell), and the loop goes on serving the other listener, whose
// messages kept coming throughout.
func TestStopWhileGathering(t *testing.T) {
	x := loopIndex(1)
	f := newLoopFleet(t, x, 2, nil)
	prompt := testPrompt(0)
	stopped := make(chan struct{})
	stopping := false
	sent := 0
	deadline := time.Now().Add(20 * time.Second)
	for done := false; !done; {
		if stopping {
			select {
			case <-stopped:
				done = true
			default:
			}
		} else if started, ended := gatherCounts(t, x); started > ended {
			stopping = true
			deadline = time.Now().Add(10 * time.Second)
			go func() {
				f.listeners[1].Stop()
				close(stopped)
			}()
		}
		if time.Now().After(deadline) {
			t.Fatalf("deadline passed (stopping: %v)", stopping)
		}
		b := sent % 40
		f.pubs[0].publish(chunk(EncodingArray, -1, prompt, b, b+1), true)
		sent++
		spin(200 * time.Microsecond) // several messages a window
	}
	if got := loopCounts(x); len(got) != 1 || got[0] != 1 {
		t.Fatalf("after the stop, loops' members %v, want [1]", got)
	}
	for range 10 {
		b := sent % 40
		f.pubs[0].publish(chunk(EncodingArray, -1, prompt, b, b+1), true)
		sent++
	}
	eventually(t, "the other listener's messages all applied", func() bool { return f.stats[0].Batches.Load() == uint64(sent) })
}

// spin waits d without sleeping: a sleep shorter than a millisecond
// lasts about a millisecond on these machines (Go's timers), which
// would make every gap the window's length.
func spin(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

// A message that arrives while a loop about to park has looked at its
// inner set and not yet at its outer one still wakes it. Taking the outer
// set's events there takes the inner set's edge with it; were that edge
// ignored, Go's poller, looking at the outer set afterwards, would find
// nothing to report, and the loop would sleep over the message. The test
// sends the message from inside that moment and holds the loop there
// until it has arrived, on one P, so that no other thread of Go's polls
// the network meanwhile and sees the edge first.
func TestNoEdgeLostBetweenTheLooks(t *testing.T) {
	x := loopIndex(1)
	var armed atomic.Bool
	var f *loopFleet
	prompt := testPrompt(0)
	x.parkGap = func() {
		if armed.CompareAndSwap(true, false) {
			f.pubs[0].publish(chunk(EncodingArray, -1, prompt, 2, 3), true)
			spin(5 * time.Millisecond) // delivered by libzmq's threads meanwhile
		}
	}
	f = newLoopFleet(t, x, 1, nil)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))

	f.pubs[0].publish(chunk(EncodingArray, -1, prompt, 0, 1), true)
	eventually(t, "the first message applied", func() bool { return f.stats[0].Batches.Load() == 1 })
	armed.Store(true)
	// The second message wakes the loop; at its next park it sends the third.
	f.pubs[0].publish(chunk(EncodingArray, -1, prompt, 1, 2), true)
	eventually(t, "the message sent while the loop was about to park applied", func() bool {
		return f.stats[0].Batches.Load() == 3
	})
	if armed.Load() {
		t.Fatal("the loop never went through the moment")
	}
}
