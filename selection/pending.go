package selection

import (
	"container/list"
	"sync"
	"time"
)

// The pending-selection cache (docs/selection-api.md, "Selecting"): /select with a selection_id
// remembers its pick so POST /reservations can book it later by id alone.

type pendingKey struct {
	part PartitionKey
	id   string
}

// pendingEntry is a remembered selection.
type pendingEntry struct {
	key        pendingKey
	rank       Rank
	blocks     []uint64 // local block hashes (for the approximate index)
	hashes     []uint64 // tracking hashes
	isl        uint64
	prefill    uint64 // effective prefill tokens at selection time
	track      bool
	expected   *uint32
	lora       string
	session    string
	generation uint64
	expires    time.Time
	bytes      int64
	elem       *list.Element
}

// pendingCache is bounded by TTL, entry count and approximate bytes; the
// oldest entries go first.
type pendingCache struct {
	ttl        time.Duration
	maxEntries int
	maxBytes   int64
	now        func() time.Time

	mu         sync.Mutex
	entries    map[pendingKey]*pendingEntry
	order      *list.List // oldest at front
	bytes      int64
	generation uint64
}

func newPendingCache(ttl time.Duration, maxEntries int, maxBytes int64, now func() time.Time) *pendingCache {
	return &pendingCache{ttl: ttl, maxEntries: maxEntries, maxBytes: maxBytes, now: now,
		entries: make(map[pendingKey]*pendingEntry), order: list.New()}
}

func entryBytes(e *pendingEntry) int64 {
	return int64(8*(len(e.blocks)+len(e.hashes)) + len(e.key.id) + len(e.key.part.Model) + len(e.key.part.Group) + len(e.lora))
}

// insert stores e, replacing an earlier selection with the same key.
func (c *pendingCache) insert(e *pendingEntry) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweepLocked(now)
	if old := c.entries[e.key]; old != nil {
		c.removeLocked(old)
	}
	c.generation++
	e.generation = c.generation
	e.expires = now.Add(c.ttl)
	e.bytes = entryBytes(e)
	if c.maxEntries == 0 || e.bytes > c.maxBytes {
		return // cannot be cached at all
	}
	for len(c.entries) >= c.maxEntries || c.bytes+e.bytes > c.maxBytes {
		c.removeLocked(c.order.Front().Value.(*pendingEntry))
	}
	e.elem = c.order.PushBack(e)
	c.entries[e.key] = e
	c.bytes += e.bytes
}

func (c *pendingCache) sweepLocked(now time.Time) {
	for f := c.order.Front(); f != nil; f = c.order.Front() {
		e := f.Value.(*pendingEntry)
		if e.expires.After(now) {
			return
		}
		c.removeLocked(e)
	}
}

func (c *pendingCache) removeLocked(e *pendingEntry) {
	c.order.Remove(e.elem)
	delete(c.entries, e.key)
	c.bytes -= e.bytes
}

// peek returns a live entry without consuming it.
func (c *pendingCache) peek(k pendingKey) *pendingEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[k]
	if e == nil || !e.expires.After(c.now()) {
		return nil
	}
	return e
}

// remove consumes the entry only if it is still the generation that was
// peeked: a newer selection under the same key wins.
func (c *pendingCache) remove(k pendingKey, generation uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[k]; e != nil && e.generation == generation {
		c.removeLocked(e)
	}
}

// discard drops any entry under k.
func (c *pendingCache) discard(k pendingKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[k]; e != nil {
		c.removeLocked(e)
	}
}

// dropWorker drops the selections that picked one of a worker's ranks.
func (c *pendingCache) dropWorker(id uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		if e.rank.WorkerID == id {
			c.removeLocked(e)
		}
	}
}

func (c *pendingCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
