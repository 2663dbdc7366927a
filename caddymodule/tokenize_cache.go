package caddymodule

import (
	"container/list"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/zeebo/xxh3"
)

// tokenCache remembers /tokenize answers by the request that produced
// them, so the same request is not tokenized twice: a client's retry, the
// n samples of one prompt sent as n requests, an agent that resends its
// conversation unchanged. The key is the partition (model and routing
// group) and the whole /tokenize body (its model, which names the adapter
// when the request does, the messages or prompt, and every template
// field), so an answer is reused only where the engine would give the
// same tokens again: the same tokenizer, the same template, the same
// input.
//
// A session's next turn is not served from its previous turn's tokens:
// the gateway cannot know where the engine's template puts the token
// boundary between the old messages and the new ones without rendering
// the template itself, and a guess that is off by one token moves every
// block hash after it (docs/vllm.md, "Tokenization").
//
// It holds at most maxTokens tokens in all (4 bytes each), each entry
// charged entryOverhead tokens more for its key, list element and map
// slot, so that many tiny answers cannot cost more memory than a few
// large ones; it evicts the least recently used answers.
type tokenCache struct {
	maxTokens int

	mu     sync.Mutex
	tokens int // charged, over all entries (cost)
	order  *list.List
	byKey  map[xxh3.Uint128]*list.Element
}

// cachedTokens is one remembered answer. Its tokens are shared by every
// request that hits it, and nobody writes to them.
type cachedTokens struct {
	key    xxh3.Uint128
	tokens []uint32
}

func newTokenCache(maxTokens int) *tokenCache {
	if maxTokens <= 0 {
		return nil
	}
	return &tokenCache{maxTokens: maxTokens, order: list.New(), byKey: map[xxh3.Uint128]*list.Element{}}
}

// tokenCacheKey hashes what decides a /tokenize answer: the partition
// asked and the body.
func tokenCacheKey(scope string, body []byte) xxh3.Uint128 {
	h := xxh3.New()
	_, _ = h.WriteString(scope)
	_, _ = h.Write([]byte{0})
	_, _ = h.Write(body)
	return h.Sum128()
}

// get returns the remembered tokens for key, or nil.
func (c *tokenCache) get(key xxh3.Uint128) []uint32 {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.byKey[key]
	if e == nil {
		tokenizeCacheTotal.WithLabelValues("miss").Inc()
		tokenizeCacheMisses.Add(1)
		return nil
	}
	c.order.MoveToFront(e)
	tokenizeCacheTotal.WithLabelValues("hit").Inc()
	tokenizeCacheHits.Add(1)
	return e.Value.(*cachedTokens).tokens
}

// put remembers tokens for key; an answer larger than the whole cache is
// not kept.
func (c *tokenCache) put(key xxh3.Uint128, tokens []uint32) {
	if c == nil || cost(tokens) > c.maxTokens {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byKey[key]; ok {
		return
	}
	for c.tokens+cost(tokens) > c.maxTokens {
		last := c.order.Back()
		old := c.order.Remove(last).(*cachedTokens)
		delete(c.byKey, old.key)
		c.tokens -= cost(old.tokens)
	}
	c.byKey[key] = c.order.PushFront(&cachedTokens{key: key, tokens: tokens})
	c.tokens += cost(tokens)
}

// The cache's lookups, for /kv_router/stats (tokenizeCacheTotal is the
// same count as a metric).
var tokenizeCacheHits, tokenizeCacheMisses atomic.Uint64

var tokenizeCacheTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "kvrouter_tokenize_cache_total",
	Help: "Lookups of the /tokenize answer cache, by outcome (hit: the worker was not asked; miss: it was).",
}, []string{"outcome"})

// entryOverhead is what an entry costs besides its tokens, in tokens of
// 4 bytes: its key, list element, map slot and slice header, about 160
// bytes.
const entryOverhead = 40

// cost is what an answer of tokens is charged against maxTokens.
func cost(tokens []uint32) int { return len(tokens) + entryOverhead }
