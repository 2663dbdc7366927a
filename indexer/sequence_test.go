package indexer

import (
	"math"
	"sync/atomic"
	"testing"
)

// TestListenerSequenceJump: a live sequence that leaps by more than MaxGap
// is a restart or garbage, not lost events. Two batches at 0 and 1, then
// two more after a leap: within MaxGap the leap is lost events and the old
// blocks stay; beyond it (2^63 with the default bound, or MaxGap+1) Lost
// stays 0, the jump is counted, and the rank's index holds only the new
// stream's blocks.
func TestListenerSequenceJump(t *testing.T) {
	for _, tc := range []struct {
		name      string
		replay    bool
		maxGap    uint64
		next      uint64 // the sequence after 0 and 1
		wantLost  uint64
		wantJumps uint64
	}{
		{"2^63 without replay", false, 0, 1 << 63, 0, 1},
		{"2^63 with replay", true, 0, 1 << 63, 0, 1},
		{"just over MaxGap", false, 10, 2 + 11, 0, 1},
		{"within MaxGap", false, 10, 2 + 10, 10, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.replay, false)
			f.cfg = func(c *ListenerConfig) { c.MaxGap = tc.maxGap }
			f.listen()
			old, fresh := testPrompt(21), testPrompt(22)
			f.pub.publish(chunk(EncodingMap, 0, old, 0, 5), true)
			f.pub.publish(chunk(EncodingMap, 0, old, 5, 10), true)
			f.waitBatches(2)
			if d := f.depth(f.rank, old); d != 10 {
				t.Fatalf("old depth %d before the leap, want 10", d)
			}
			f.pub.jumpTo(tc.next)
			f.pub.publish(chunk(EncodingMap, 0, fresh, 0, 5), true)
			f.pub.publish(chunk(EncodingMap, 0, fresh, 5, 8), true)
			f.waitBatches(4)
			s := f.stats
			if s.Lost.Load() != tc.wantLost || s.Jumps.Load() != tc.wantJumps || s.Restarts.Load() != 0 {
				t.Fatalf("lost %d jumps %d restarts %d; want lost %d jumps %d restarts 0",
					s.Lost.Load(), s.Jumps.Load(), s.Restarts.Load(), tc.wantLost, tc.wantJumps)
			}
			wantOld, wantBlocks := uint32(10), 18
			if tc.wantJumps > 0 {
				wantOld, wantBlocks = 0, 8 // dropped, then rebuilt from the new stream alone
			}
			if d := f.depth(f.rank, old); d != wantOld {
				t.Fatalf("old depth %d after the leap, want %d", d, wantOld)
			}
			if d := f.depth(f.rank, fresh); d != 8 {
				t.Fatalf("new stream depth %d, want 8", d)
			}
			if n := f.index.Blocks(part, f.rank); n != wantBlocks {
				t.Fatalf("the rank holds %d blocks, want %d", n, wantBlocks)
			}
		})
	}
}

// TestListenerDefaultMaxGapLeapIsLost: a leap of exactly DefaultMaxGap is
// still a gap, counted in Lost, with the replay asked for it.
func TestListenerDefaultMaxGapLeapIsLost(t *testing.T) {
	f := newFixture(t, false, true)
	f.pub.publish(chunk(EncodingMap, 0, testPrompt(23), 0, 5), true)
	f.waitBatches(1)
	f.pub.jumpTo(1 + DefaultMaxGap)
	f.pub.publish(chunk(EncodingMap, 0, testPrompt(24), 0, 5), true)
	f.waitBatches(2)
	if f.stats.Lost.Load() != DefaultMaxGap || f.stats.Jumps.Load() != 0 {
		t.Fatalf("lost %d jumps %d; want lost %d jumps 0", f.stats.Lost.Load(), f.stats.Jumps.Load(), DefaultMaxGap)
	}
}

// TestAddSatSaturates: counters stop at the largest uint64.
func TestAddSatSaturates(t *testing.T) {
	for _, tc := range []struct{ start, add, want uint64 }{
		{0, 1, 1},
		{41, 1, 42},
		{math.MaxUint64 - 5, 5, math.MaxUint64},
		{math.MaxUint64 - 5, 6, math.MaxUint64},
		{math.MaxUint64, 1, math.MaxUint64},
		{1 << 63, 1 << 63, math.MaxUint64},
	} {
		var c atomic.Uint64
		c.Store(tc.start)
		addSat(&c, tc.add)
		if c.Load() != tc.want {
			t.Errorf("%d + %d = %d, want %d", tc.start, tc.add, c.Load(), tc.want)
		}
	}
}

// TestListenerLostSaturates: gaps that add up past 2^64 (two leaps with a
// restart between) leave Lost at its ceiling instead of wrapping to a
// small number.
func TestListenerLostSaturates(t *testing.T) {
	f := newFixture(t, false, false)
	f.cfg = func(c *ListenerConfig) { c.MaxGap = math.MaxUint64 } // every leap is a gap
	f.listen()
	f.pub.publish(chunk(EncodingMap, 0, testPrompt(25), 0, 5), true)
	f.pub.jumpTo(1 << 63) // 2^63-1 lost
	f.pub.publish(chunk(EncodingMap, 0, testPrompt(26), 0, 5), true)
	f.pub.restart()
	f.pub.publish(chunk(EncodingMap, 0, testPrompt(27), 0, 5), true)
	f.pub.jumpTo(math.MaxUint64) // 2^64-2 more
	f.pub.publish(chunk(EncodingMap, 0, testPrompt(28), 0, 5), true)
	f.waitBatches(4)
	if f.stats.Lost.Load() != math.MaxUint64 || f.stats.Restarts.Load() != 1 {
		t.Fatalf("lost %d restarts %d, want lost saturated at %d and one restart",
			f.stats.Lost.Load(), f.stats.Restarts.Load(), uint64(math.MaxUint64))
	}
}
