// Package engine is the simulated inference engine that kvmock serves over
// HTTP in real time and kvsim runs in virtual time: a paged KV cache with
// prefix caching (BlockPool) and a vLLM V1-like scheduler step (Scheduler).
// It has no clock and no goroutine; its callers decide how long a step
// takes to pass.
package engine

// BlockPool is one engine's paged KV cache with prefix caching, modelled
// on vLLM's BlockPool: a fixed number of blocks; a map from block hash to
// the block that holds it; a reference count per block for the requests
// using it; and one queue of free blocks, least recently freed first. A
// freed block keeps its hash (it stays cached and can be hit again) until
// allocation takes it from the head of the queue and evicts it.
//
// In vLLM the queue starts out holding every block, so blocks that never
// held anything are used before any cached block is evicted. Here those
// never-used blocks are not materialized: they are the indices from
// len(hash) to capacity, handed out before the queue is touched, and the
// per-block arrays grow as they are. That is the same order, and an idle
// engine of a thousand-worker fleet costs next to no memory.
//
// The pool is owned by its engine's scheduler; it has no lock.
type BlockPool struct {
	capacity int
	// Per-block state, for the blocks used at least once.
	hash   []uint64
	cached []bool
	ref    []int32
	// prev and next link the free queue; -1 ends it.
	prev, next []int32
	head, tail int32
	queued     int // blocks in the free queue
	byHash     map[uint64]int32
	// evicted collects the hashes of the blocks evicted since the scheduler
	// last took them, in eviction order, for BlockRemoved events.
	evicted []uint64
}

// NewBlockPool returns an empty pool of n blocks.
func NewBlockPool(n int) *BlockPool {
	p := &BlockPool{capacity: n}
	p.Reset()
	return p
}

// Reset returns the pool to the state of a fresh process: every block
// free and nothing cached. It records no evictions.
func (p *BlockPool) Reset() {
	p.hash, p.cached, p.ref, p.prev, p.next = nil, nil, nil, nil, nil
	p.byHash = make(map[uint64]int32)
	p.head, p.tail = -1, -1
	p.queued = 0
	p.evicted = nil
}

// Size is the pool's capacity in blocks.
func (p *BlockPool) Size() int { return p.capacity }

// NumFree counts the blocks no request uses, cached or not.
func (p *BlockPool) NumFree() int { return p.capacity - len(p.hash) + p.queued }

// NumCached counts the blocks that hold a hash.
func (p *BlockPool) NumCached() int { return len(p.byHash) }

// Match counts the leading hashes that are cached, up to limit, and how
// many of those blocks are free (they would leave the free queue when
// taken). It changes nothing, so a request that cannot be admitted yet
// does not disturb the LRU order.
func (p *BlockPool) Match(hashes []uint64, limit int) (hits, freeHits int) {
	for _, h := range hashes[:min(limit, len(hashes))] {
		b, ok := p.byHash[h]
		if !ok {
			break
		}
		hits++
		if p.ref[b] == 0 {
			freeHits++
		}
	}
	return hits, freeHits
}

// Take references the blocks of the first n hashes, which Match found
// cached, and appends them to dst.
func (p *BlockPool) Take(hashes []uint64, n int, dst []int32) []int32 {
	for _, h := range hashes[:n] {
		b := p.byHash[h]
		if p.ref[b] == 0 {
			p.unlink(b)
		}
		p.ref[b]++
		dst = append(dst, b)
	}
	return dst
}

// Allocate takes n free blocks, never-used ones first and then from the
// head of the free queue, and appends them to dst. A cached block taken
// from the queue is evicted. The caller has checked NumFree.
func (p *BlockPool) Allocate(n int, dst []int32) []int32 {
	for range n {
		if len(p.hash) < p.capacity {
			b := int32(len(p.hash))
			p.hash, p.cached, p.ref = append(p.hash, 0), append(p.cached, false), append(p.ref, 1)
			p.prev, p.next = append(p.prev, -1), append(p.next, -1)
			dst = append(dst, b)
			continue
		}
		b := p.head
		p.unlink(b)
		if p.cached[b] {
			p.evict(b)
		}
		p.ref[b] = 1
		dst = append(dst, b)
	}
	return dst
}

// evict takes block b's hash away and records it for a BlockRemoved.
func (p *BlockPool) evict(b int32) {
	h := p.hash[b]
	if p.byHash[h] == b {
		delete(p.byHash, h)
	}
	p.cached[b] = false
	p.evicted = append(p.evicted, h)
}

// Register caches block b under hash h. It declines (and reports false)
// when another block already holds h, so that one hash never names two
// blocks; newer vLLM skips such a store the same way.
func (p *BlockPool) Register(b int32, h uint64) bool {
	if _, dup := p.byHash[h]; dup || p.cached[b] {
		return false
	}
	p.byHash[h] = b
	p.hash[b], p.cached[b] = h, true
	return true
}

// Release drops a request's references. Blocks are freed in reverse
// order, as vLLM does, so that a sequence's last blocks sit nearer the head
// of the queue and are evicted before its first ones: prefixes outlive
// their tails.
func (p *BlockPool) Release(blocks []int32) {
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		p.ref[b]--
		if p.ref[b] == 0 {
			p.pushTail(b)
		}
	}
}

// Clear forgets every cached hash, as vLLM's reset_prefix_cache, without
// recording evictions (the caller announces AllBlocksCleared instead).
// Blocks in use stay in use.
func (p *BlockPool) Clear() {
	for _, b := range p.byHash {
		p.cached[b] = false
	}
	clear(p.byHash)
}

// TakeEvicted returns the recorded evictions and forgets them.
func (p *BlockPool) TakeEvicted() []uint64 {
	if len(p.evicted) == 0 {
		return nil
	}
	out := append([]uint64(nil), p.evicted...)
	p.evicted = p.evicted[:0]
	return out
}

// pushTail appends block b to the free queue.
func (p *BlockPool) pushTail(b int32) {
	p.prev[b], p.next[b] = p.tail, -1
	if p.tail >= 0 {
		p.next[p.tail] = b
	} else {
		p.head = b
	}
	p.tail = b
	p.queued++
}

// unlink takes block b out of the free queue.
func (p *BlockPool) unlink(b int32) {
	if p.prev[b] >= 0 {
		p.next[p.prev[b]] = p.next[b]
	} else {
		p.head = p.next[b]
	}
	if p.next[b] >= 0 {
		p.prev[p.next[b]] = p.prev[b]
	} else {
		p.tail = p.prev[b]
	}
	p.prev[b], p.next[b] = -1, -1
	p.queued--
}
