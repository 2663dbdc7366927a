package main

import (
	"container/list"
	"io"

	"github.com/kvrouter/caddy-kvrouter/internal/trace"
)

// Traces are read by package internal/trace (the Mooncake format); these
// names keep kvbench's own.
type traceRequest = trace.Request

const traceVocab = trace.Vocab

func readTrace(r io.Reader, blockTokens int) ([]traceRequest, error) {
	return trace.Read(r, blockTokens)
}

func readTraceFile(path string, blockTokens int) ([]traceRequest, error) {
	return trace.ReadFile(path, blockTokens)
}

func traceTokens(r traceRequest, blockTokens int) []uint32 { return trace.Tokens(r, blockTokens) }

// Ceilings: the prefix hit ratio a trace allows, from the trace alone.
// Requests are taken in arrival order and each is served by a single
// prefix cache of trace blocks: a request reuses the leading blocks of its
// prompt that the cache holds (a block counts only after the same blocks
// before it, as in a paged prefix cache), then leaves all its blocks in
// the cache. The unbounded cache keeps everything; the capacity cache is
// an LRU as large as the whole fleet's caches together, which is what
// perfect routing over one pooled cache could reach. No placement, no
// timing: a request's blocks are in the cache as soon as it arrives.
// What a request reuses is counted the way vLLM would report it: never
// its last token (the engine computes it to sample from) and in whole
// engine blocks.

// chainKey names a block by its id and the block before it, so that a
// block matches only after the same prefix.
type chainKey struct {
	parent int32 // the previous block's node, -1 for the first block
	id     int64
}

// chainNodes numbers the distinct prefixes (block chains) of a trace: two
// requests get the same node at position i exactly when their first i+1
// ids agree. Node numbers are dense, from 0.
type chainNodes map[chainKey]int32

// path returns the nodes of r's blocks, numbering new prefixes.
func (c chainNodes) path(r traceRequest) []int32 {
	out := make([]int32, len(r.Blocks))
	parent := int32(-1)
	for i, id := range r.Blocks {
		k := chainKey{parent, id}
		n, ok := c[k]
		if !ok {
			n = int32(len(c))
			c[k] = n
		}
		out[i], parent = n, n
	}
	return out
}

// lruBlocks is an LRU set of chain nodes, bounded by a count of blocks.
type lruBlocks struct {
	cap   int
	order *list.List // of int32 nodes, the most recently used at the front
	at    map[int32]*list.Element
}

func newLRUBlocks(capacity int) *lruBlocks {
	return &lruBlocks{cap: capacity, order: list.New(), at: map[int32]*list.Element{}}
}

func (l *lruBlocks) has(n int32) bool { _, ok := l.at[n]; return ok }

// touch makes n the most recently used block, inserting it and evicting
// the least recently used one past the capacity.
func (l *lruBlocks) touch(n int32) {
	if e, ok := l.at[n]; ok {
		l.order.MoveToFront(e)
		return
	}
	l.at[n] = l.order.PushFront(n)
	if l.order.Len() > l.cap {
		delete(l.at, l.order.Remove(l.order.Back()).(int32))
	}
}

// servedTokens is how many of a prompt of input tokens a cache holding
// its first matched blocks (of blockTokens) serves: never the last token,
// and in whole engine blocks of engineBlock tokens (0 or 1: any count).
func servedTokens(matched, input, blockTokens, engineBlock int) int {
	n := min(matched*blockTokens, input-1)
	if engineBlock > 1 {
		n = n / engineBlock * engineBlock
	}
	return max(0, n)
}

// traceCeilings returns, for each request of reqs in order, the tokens an
// unbounded cache and an LRU cache of capacityBlocks trace blocks would
// serve it. With capacityBlocks < 1 the capacity ceiling is not computed
// (nil).
func traceCeilings(reqs []traceRequest, blockTokens, engineBlock, capacityBlocks int) (unbounded, capacity []int) {
	nodes := chainNodes{}
	seen := map[int32]bool{}
	var lru *lruBlocks
	unbounded = make([]int, len(reqs))
	if capacityBlocks > 0 {
		lru = newLRUBlocks(capacityBlocks)
		capacity = make([]int, len(reqs))
	}
	for i, r := range reqs {
		path := nodes.path(r)
		m := 0
		for m < len(path) && seen[path[m]] {
			m++
		}
		unbounded[i] = servedTokens(m, r.Input, blockTokens, engineBlock)
		for _, n := range path {
			seen[n] = true
		}
		if lru == nil {
			continue
		}
		m = 0
		for m < len(path) && lru.has(path[m]) {
			m++
		}
		capacity[i] = servedTokens(m, r.Input, blockTokens, engineBlock)
		// The last block first: a prompt's leading blocks end up the most
		// recently used, so its tail is evicted before its prefix, as
		// vLLM frees a finished request's blocks from the end.
		for k := len(path) - 1; k >= 0; k-- {
			lru.touch(path[k])
		}
	}
	return unbounded, capacity
}
