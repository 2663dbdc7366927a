package main

// blockPool is one engine's paged KV cache with prefix caching, modelled
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
// The pool is owned by its engine's scheduler goroutine; it has no lock.
type blockPool struct {
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

// newBlockPool returns an empty pool of n blocks.
func newBlockPool(n int) *blockPool {
	p := &blockPool{capacity: n}
	p.reset()
	return p
}

// reset returns the pool to the state of a fresh process: every block
// free and nothing cached. It records no evictions.
func (p *blockPool) reset() {
	p.hash, p.cached, p.ref, p.prev, p.next = nil, nil, nil, nil, nil
	p.byHash = make(map[uint64]int32)
	p.head, p.tail = -1, -1
	p.queued = 0
	p.evicted = nil
}

// size is the pool's capacity in blocks.
func (p *blockPool) size() int { return p.capacity }

// numFree counts the blocks no request uses, cached or not.
func (p *blockPool) numFree() int { return p.capacity - len(p.hash) + p.queued }

// numCached counts the blocks that hold a hash.
func (p *blockPool) numCached() int { return len(p.byHash) }

// match counts the leading hashes that are cached, up to limit, and how
// many of those blocks are free (they would leave the free queue when
// taken). It changes nothing, so a request that cannot be admitted yet
// does not disturb the LRU order.
func (p *blockPool) match(hashes []uint64, limit int) (hits, freeHits int) {
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

// take references the blocks of the first n hashes, which match found
// cached, and appends them to dst.
func (p *blockPool) take(hashes []uint64, n int, dst []int32) []int32 {
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

// allocate takes n free blocks, never-used ones first and then from the
// head of the free queue, and appends them to dst. A cached block taken
// from the queue is evicted. The caller has checked numFree.
func (p *blockPool) allocate(n int, dst []int32) []int32 {
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
func (p *blockPool) evict(b int32) {
	h := p.hash[b]
	if p.byHash[h] == b {
		delete(p.byHash, h)
	}
	p.cached[b] = false
	p.evicted = append(p.evicted, h)
}

// register caches block b under hash h. It declines (and reports false)
// when another block already holds h, so that one hash never names two
// blocks; newer vLLM skips such a store the same way.
func (p *blockPool) register(b int32, h uint64) bool {
	if _, dup := p.byHash[h]; dup || p.cached[b] {
		return false
	}
	p.byHash[h] = b
	p.hash[b], p.cached[b] = h, true
	return true
}

// release drops a request's references. Blocks are freed in reverse
// order, as vLLM does, so that a sequence's last blocks sit nearer the head
// of the queue and are evicted before its first ones: prefixes outlive
// their tails.
func (p *blockPool) release(blocks []int32) {
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		p.ref[b]--
		if p.ref[b] == 0 {
			p.pushTail(b)
		}
	}
}

// clear forgets every cached hash, as vLLM's reset_prefix_cache, without
// recording evictions (the caller announces AllBlocksCleared instead).
// Blocks in use stay in use.
func (p *blockPool) clear() {
	for _, b := range p.byHash {
		p.cached[b] = false
	}
	clear(p.byHash)
}

// takeEvicted returns the recorded evictions and forgets them.
func (p *blockPool) takeEvicted() []uint64 {
	if len(p.evicted) == 0 {
		return nil
	}
	out := append([]uint64(nil), p.evicted...)
	p.evicted = p.evicted[:0]
	return out
}

// pushTail appends block b to the free queue.
func (p *blockPool) pushTail(b int32) {
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
func (p *blockPool) unlink(b int32) {
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
