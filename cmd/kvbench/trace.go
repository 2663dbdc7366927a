package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"container/list"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"time"
)

// Request traces in the Mooncake format, which `kvbench replay` plays
// through a gateway. A trace is JSON Lines (optionally gzipped): one
// object per request with
//
//	timestamp      its arrival, in milliseconds from the trace's start
//	input_length   its prompt's length in tokens
//	output_length  the tokens it generated
//	hash_ids       its prompt as a list of block ids, one per block of
//	               blockTokens tokens (512 in the published traces); two
//	               prompts whose ids agree at a position have the same
//	               content there, and the last id stands for what remains
//	               of input_length, which may be a partial block
//
// The trace holds no text: traceTokens makes token ids from the block ids,
// so that equal ids give equal tokens and the engines' prefix caches see
// exactly the reuse the trace describes.

// traceRequest is one line of a trace.
type traceRequest struct {
	// Line is the request's line number in the file (from 1).
	Line    int
	Arrival time.Duration
	Input   int
	Output  int
	Blocks  []int64
}

// traceLine is a line as written; pointers tell a missing field from a
// zero.
type traceLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

// parseTraceLine checks one line and turns it into a request.
func parseTraceLine(b []byte, blockTokens int) (traceRequest, error) {
	var l traceLine
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&l); err != nil {
		return traceRequest{}, err
	}
	if dec.More() {
		return traceRequest{}, errors.New("more than one JSON value")
	}
	switch {
	case l.Timestamp == nil:
		return traceRequest{}, errors.New("no timestamp")
	case *l.Timestamp < 0:
		return traceRequest{}, fmt.Errorf("timestamp %v is negative", *l.Timestamp)
	case l.InputLength == nil:
		return traceRequest{}, errors.New("no input_length")
	case *l.InputLength < 1:
		return traceRequest{}, fmt.Errorf("input_length %d is below 1", *l.InputLength)
	case l.OutputLength == nil:
		return traceRequest{}, errors.New("no output_length")
	case *l.OutputLength < 0:
		return traceRequest{}, fmt.Errorf("output_length %d is negative", *l.OutputLength)
	}
	if want := (*l.InputLength + blockTokens - 1) / blockTokens; len(l.HashIDs) != want {
		return traceRequest{}, fmt.Errorf("input_length %d makes %d blocks of %d tokens, but hash_ids has %d",
			*l.InputLength, want, blockTokens, len(l.HashIDs))
	}
	for _, id := range l.HashIDs {
		if id < 0 {
			return traceRequest{}, fmt.Errorf("hash id %d is negative", id)
		}
	}
	return traceRequest{
		Arrival: time.Duration(*l.Timestamp * float64(time.Millisecond)),
		Input:   *l.InputLength,
		Output:  *l.OutputLength,
		Blocks:  l.HashIDs,
	}, nil
}

// readTrace reads a trace from r, gzipped or not (told by its first
// bytes, not by a file name). Blank lines are skipped; any other line that
// is not a valid request fails the whole read with its line number. The
// requests come back in arrival order (a stable sort: lines with the same
// timestamp keep the file's order).
func readTrace(r io.Reader, blockTokens int) ([]traceRequest, error) {
	if blockTokens < 1 {
		return nil, fmt.Errorf("block size %d: must be at least 1 token", blockTokens)
	}
	br := bufio.NewReaderSize(r, 1<<16)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		defer zr.Close()
		br = bufio.NewReaderSize(zr, 1<<16)
	}
	sc := bufio.NewScanner(br)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	var out []traceRequest
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		req, err := parseTraceLine(b, blockTokens)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		req.Line = line
		out = append(out, req)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("after line %d: %w", line, err)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Arrival < out[j].Arrival })
	return out, nil
}

// readTraceFile is readTrace on a file.
func readTraceFile(path string, blockTokens int) ([]traceRequest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	reqs, err := readTrace(f, blockTokens)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return reqs, nil
}

// traceVocab bounds the token ids made from a trace: below it, kvmock (and
// a Llama-3 tokenizer) treat every id as an ordinary token, never as a
// special one.
const traceVocab = 128_000

// mix64 is SplitMix64's finalizer: a cheap bijection of 64-bit integers
// whose outputs look independent for nearby inputs.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// blockToken is token i of the block whose id is id: a function of the
// two alone, so a block id stands for the same tokens wherever it occurs.
func blockToken(id int64, i int) uint32 {
	return uint32(mix64(mix64(uint64(id))+uint64(i)) % traceVocab)
}

// traceTokens is the prompt of r: blockTokens tokens per block id, the
// last block cut so that the prompt has r.Input tokens.
func traceTokens(r traceRequest, blockTokens int) []uint32 {
	out := make([]uint32, 0, r.Input)
	for _, id := range r.Blocks {
		n := min(blockTokens, r.Input-len(out))
		for i := range n {
			out = append(out, blockToken(id, i))
		}
	}
	return out
}

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
