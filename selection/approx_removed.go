package selection

// Removing a worker from the approximate index (its worker taken out, or
// deleted, or moved to another endpoint) used to walk its partition's
// trie under the index's write lock to drop its holds: at the default
// bound, seconds during which no booking or lookup ran, once for every
// worker a rolling restart took out. Instead the removal's time is kept
// for the partition, and a hold of the worker stamped before it (its
// expiry at most removal time plus the TTL) no longer counts: lookups and
// dumps pass it over, and the expiry queue takes it in its turn, as it
// takes every hold. A booking after the removal stamps the hold afresh.
// After one TTL every such hold has expired, and the removal is dropped.

// removals are, per partition root, the time each removed worker was
// removed (unix nanoseconds).
type removals map[*approxEdge]map[uint64]int64

// stale reports whether h was stamped before its worker's removal, in
// the partition whose removals are rm (nil: none).
func (a *ApproxIndex) stale(rm map[uint64]int64, h approxHold) bool {
	if rm == nil {
		return false
	}
	at, ok := rm[h.rank.WorkerID]
	return ok && h.expires-int64(a.ttl) <= at
}

// forgetRemovalsLocked drops the removals older than one TTL: every hold
// they passed over has expired since. a.mu is held.
func (a *ApproxIndex) forgetRemovalsLocked(now int64) {
	for root, rm := range a.removed {
		for w, at := range rm {
			if at+int64(a.ttl) < now {
				delete(rm, w)
			}
		}
		if len(rm) == 0 {
			delete(a.removed, root)
		}
	}
}
