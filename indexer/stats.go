package indexer

import (
	"math"
	"sync/atomic"
)

// Stats counts what listeners saw; all fields are safe to read at any
// time. Every counter saturates at the largest uint64 instead of wrapping
// (addSat), so a hostile publisher cannot turn a huge count into a small
// one.
type Stats struct {
	Messages    atomic.Uint64 // well-framed messages received live
	Batches     atomic.Uint64 // payloads applied (live or replayed)
	Malformed   atomic.Uint64 // frames or payloads that could not be used
	Stale       atomic.Uint64 // duplicates of already applied sequences
	Gaps        atomic.Uint64 // sequence jumps seen
	Replays     atomic.Uint64 // replay requests made
	Replayed    atomic.Uint64 // batches recovered by replay
	Lost        atomic.Uint64 // sequences that could not be recovered (at most MaxGap per gap)
	Restarts    atomic.Uint64 // publishers seen restarting (sequence went back)
	Rejected    atomic.Uint64 // events the index refused (unknown parent, token ids not filling the blocks)
	Jumps       atomic.Uint64 // live sequence jumps over MaxGap: taken as a restart, the rank's blocks dropped
	UnknownRank atomic.Uint64 // batches dropped: their dp_rank is not one of the worker's ranks
	// Disconnects counts connections to or from publishers that libzmq
	// dropped. A message over the size limit (MaxMessageBytes) is one
	// cause, a publisher going away another: libzmq 4.3 reports both as
	// ZMQ_EVENT_DISCONNECTED and no event carries the reason, so oversized
	// messages cannot be counted apart.
	Disconnects atomic.Uint64
}

// addSat adds n to c, stopping at the largest uint64 rather than wrapping.
func addSat(c *atomic.Uint64, n uint64) {
	for {
		old := c.Load()
		if old == math.MaxUint64 {
			return
		}
		v := old + n
		if v < old {
			v = math.MaxUint64
		}
		if c.CompareAndSwap(old, v) {
			return
		}
	}
}
