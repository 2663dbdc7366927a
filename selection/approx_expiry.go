package selection

// The approximate index's expiry queue: an entry for each hold, appended
// when a record sets it. A hold's expiry is its record's time plus the
// one TTL, so the queue is in the order the holds expire, except for
// holds refreshed since their entry was queued (the front queues such an
// entry again, at its new expiry, rather than dropping the hold) and the
// copies a split makes (queued when it makes them, after holds that
// expire later): those stay until the front reaches them, and no lookup
// counts a hold once expired. An entry whose edge is gone is stale:
// taking it only frees it. Taking the front is how holds expire and how
// they are evicted, without a walk of the trie under the lock.

// approxExpiry is one queue entry: rank's hold on edge, as it was set.
type approxExpiry struct {
	edge    *approxEdge
	rank    Rank
	expires int64
}

// approxQueue is a FIFO of entries in chunks of queueChunk, so that
// neither growing nor draining it ever copies it (one slice of millions of
// entries, grown or compacted under the index's lock, held it for tens of
// milliseconds).
type approxQueue struct {
	chunks [][]approxExpiry // each of capacity queueChunk; the last is being filled
	head   int              // entries of chunks[0] already taken
	n      int
	spare  []approxExpiry // one drained chunk kept for reuse
}

const queueChunk = 1024

func (q *approxQueue) len() int { return q.n }

func (q *approxQueue) push(e *approxEdge, r Rank, expires int64) {
	if len(q.chunks) == 0 || len(q.chunks[len(q.chunks)-1]) == queueChunk {
		c := q.spare
		if c == nil {
			c = make([]approxExpiry, 0, queueChunk)
		}
		q.spare = nil
		q.chunks = append(q.chunks, c)
	}
	last := &q.chunks[len(q.chunks)-1]
	*last = append(*last, approxExpiry{edge: e, rank: r, expires: expires})
	q.n++
}

func (q *approxQueue) front() *approxExpiry { return &q.chunks[0][q.head] }

func (q *approxQueue) pop() approxExpiry {
	c := q.chunks[0]
	it := c[q.head]
	c[q.head] = approxExpiry{} // the edge may be collected
	q.head++
	q.n--
	if q.head == len(c) && (len(c) == queueChunk || q.n == 0) {
		q.spare = c[:0]
		q.chunks[0] = nil
		q.chunks = q.chunks[1:]
		q.head = 0
	}
	return it
}

// expireLocked takes the expired entries from the front, and forgets
// the removals no hold depends on. a.mu is held.
func (a *ApproxIndex) expireLocked(now int64) {
	for a.expiries.len() > 0 && a.expiries.front().expires <= now {
		a.takeFrontLocked(now)
	}
	if len(a.removed) > 0 && now-a.lastForget > int64(a.ttl)/16 {
		a.forgetRemovalsLocked(now)
		a.lastForget = now
	}
}

// takeFrontLocked takes the front entry and, unless it is stale, drops
// its hold (counted as evicted if it had not expired by now), then the
// edges left with no hold and no child, upwards. a.mu is held.
func (a *ApproxIndex) takeFrontLocked(now int64) {
	it := a.expiries.pop()
	a.room.bytes -= approxQueueBytes
	e := it.edge
	if e.removed {
		return
	}
	i := holdIndex(e, it.rank)
	if i < 0 {
		return // dropped since
	}
	if later := e.holds[i].expires; later > it.expires {
		// Refreshed since: queued again, at its new expiry. One entry a
		// hold, so that booking one prompt again and again does not fill
		// the index with entries that evict others' holds.
		a.expiries.push(e, it.rank, later)
		a.room.bytes += approxQueueBytes
		return
	}
	if it.expires > now {
		a.room.evicted.Add(uint64(len(e.keys)))
	}
	last := len(e.holds) - 1
	e.holds[i] = e.holds[last]
	e.holds[last] = approxHold{}
	e.holds = e.holds[:last]
	a.room.bytes -= approxHoldBytes
	for e.parent != nil && len(e.holds) == 0 && len(e.children) == 0 {
		parent := e.parent
		delete(parent.children, e.keys[0])
		a.room.bytes -= edgeCost(len(e.keys), 0) + mapCost(e)
		e.cut()
		e = parent
	}
	e.shrinkChildren()
	a.dropIfEmptyLocked(e)
}

// dropIfEmptyLocked drops root e's partition once e has no child.
func (a *ApproxIndex) dropIfEmptyLocked(e *approxEdge) {
	p, isRoot := a.rootKeys[e]
	if !isRoot || len(e.children) > 0 {
		return
	}
	delete(a.parts, p)
	delete(a.rootKeys, e)
	delete(a.removed, e)
	a.room.bytes -= approxEdgeBytes + mapCost(e)
}

func holdIndex(e *approxEdge, r Rank) int {
	for i := range e.holds {
		if e.holds[i].rank == r {
			return i
		}
	}
	return -1
}
