package indexer

import (
	"math"
	"testing"
	"time"
)

// TestLagWatchIgnoresStampsThatAreNotTimes: a publisher's garbage stamps
// neither count nor move the baseline.
func TestLagWatchIgnoresStampsThatAreNotTimes(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	var w lagWatch
	if w.late(1_000_000, now) {
		t.Fatal("the first batch set no baseline")
	}
	for _, s := range []float64{0, -5, math.NaN(), math.Inf(1), math.Inf(-1)} {
		if w.late(s, now.Add(10*time.Second)) {
			t.Errorf("stamp %v counted as late", s)
		}
	}
	if !w.late(1_000_000, now.Add(10*time.Second)) {
		t.Error("a batch 10 s late after garbage stamps was not counted")
	}
	w.reset()
	if w.late(1_000_000, now.Add(20*time.Second)) {
		t.Error("a reset watch counted the first batch after it")
	}
}
