package indexer

import (
	"math"
	"time"
)

// A listener falls behind its publisher when it applies batches slower
// than the engine publishes them: the batches wait in the SUB's bounded
// queue (subQueue messages), then in the publisher's (its high-water mark),
// which drops them past its own bound. Drops show as gaps; lagWatch tells
// it earlier, from the publisher's stamp on each batch (vLLM and SGLang
// stamp a batch with their wall clock when they publish it).
//
// Clocks of two machines disagree, so the stamp is not compared with ours
// directly: the smallest (arrival − stamp) seen is the baseline (the
// network's delay plus the clocks' offset), and a batch counts as late when
// it arrives more than behindAfter after that. A publisher restart starts a
// new baseline. A publisher can make its own batches look late (stamps
// that go back) but nothing else: the watch only feeds a counter.
type lagWatch struct {
	base float64 // seconds; valid when have
	have bool
}

// behindAfter is how much later than its baseline a batch may arrive
// before it counts as applied behind its publisher: above the jitter of a
// scheduler step and of stamps that keep whole seconds only.
const behindAfter = 2.0

// late reports whether a batch stamped stamp (seconds since the epoch),
// applied at now, arrived behindAfter or more after the baseline. Stamps
// that are not a time (0, negative, NaN, infinite) are ignored.
func (w *lagWatch) late(stamp float64, now time.Time) bool {
	if !(stamp > 0) || math.IsInf(stamp, 1) {
		return false
	}
	d := float64(now.UnixNano())/1e9 - stamp
	if !w.have || d < w.base {
		w.base, w.have = d, true
		return false
	}
	return d-w.base >= behindAfter
}

// reset forgets the baseline (a publisher restarted).
func (w *lagWatch) reset() { *w = lagWatch{} }
