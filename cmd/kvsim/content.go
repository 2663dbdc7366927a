package main

import (
	"github.com/kvrouter/caddy-kvrouter/internal/trace"
	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Prompts are made of blocks of content: each full block of blockSize
// tokens is named by a content id, and its tokens are a function of that id
// alone (trace.BlockToken), so equal ids are equal tokens wherever they
// occur, for the engines, the index and the router alike. A prompt's
// partial last block is never hashed by anyone, so it needs no id.

// blocks is a growing prompt: the content ids of its full blocks, their
// local block hashes (what the router hashes tokens into) and their chained
// sequence hashes, which the simulated engines also use as their own block
// hashes. A turn's prompt is a prefix of its session's blocks.
type blocks struct {
	ids   []int64
	local []uint64
	chain []uint64
}

// hasher computes local block hashes of content ids, remembering them: a
// trace names the same blocks again and again.
type hasher struct {
	blockSize int
	seed      uint64
	memo      map[int64]uint64 // nil: do not remember (session content is hashed once)
	tokens    []uint32
	out       []uint64
}

func newHasher(blockSize int, memo bool) *hasher {
	h := &hasher{blockSize: blockSize, seed: selection.SaltedSeed("", "")}
	if memo {
		h.memo = make(map[int64]uint64)
	}
	return h
}

// tokensOf appends the tokens of content block id to dst: trace.BlockToken
// for each position, with the id's mix computed once per block (the same
// numbers; this is where a cold run spends its time).
func (h *hasher) tokensOf(dst []uint32, id int64) []uint32 {
	base := trace.MixID(id)
	for i := range h.blockSize {
		dst = append(dst, trace.TokenAt(base, i))
	}
	return dst
}

// local is the router's local hash of block id.
func (h *hasher) local(id int64) uint64 {
	if v, ok := h.memo[id]; ok {
		return v
	}
	h.tokens = h.tokensOf(h.tokens[:0], id)
	h.out = selection.AppendBlockHashes(h.out[:0], h.tokens, h.blockSize, selection.HashOptions{Seed: h.seed})
	v := h.out[0]
	if h.memo != nil {
		h.memo[id] = v
	}
	return v
}

// push appends content block id to b.
func (b *blocks) push(h *hasher, id int64) {
	l := h.local(id)
	c := l
	if n := len(b.chain); n > 0 {
		c = selection.NextSequenceHash(b.chain[n-1], l)
	}
	b.ids, b.local, b.chain = append(b.ids, id), append(b.local, l), append(b.chain, c)
}
