package indexer

import (
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
	x := New()
	x.IngestCores = 1
	x.ConfigurePartition(part, lbs, false)
	const n = 4
	f := newLoopFleet(t, x, n, nil)
	prompts := make([][]uint32, n)
	for i := range prompts {
		prompts[i] = testPrompt(uint32(i))
	}

	// Single messages, one publisher after another, at gaps of 0, 100,
	// 200 and 400 µs in turn: whatever a message costs this machine (and
	// however late a loaded one wakes a sleeper), some gap lets the loop
	// park and wakes it again within the window.
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
			time.Sleep(time.Duration(50<<gap) * time.Microsecond)
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
