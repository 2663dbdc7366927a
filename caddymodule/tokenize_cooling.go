package caddymodule

import (
	"sync"
	"sync/atomic"
	"time"
)

// tokenizeCooldown is how long a worker whose /tokenize failed (no
// answer within the time, no connection, a 5xx) is asked after the
// others. All of one request's tries share tokenize_timeout, so a worker
// that never answered took it whole: taking turns with two good workers,
// it cost every third text request the timeout (p90 66 → 526 ms) and its
// prefix routing.
const tokenizeCooldown = 10 * time.Second

// tokenizerCooling holds the workers whose /tokenize failed lately. Its
// size is bounded by the catalog's endpoints, and expired entries go at
// the next failure.
type tokenizerCooling struct {
	n     atomic.Int32 // entries in until; 0 spares requests the lock
	mu    sync.Mutex
	until map[string]time.Time
}

// add makes endpoint wait tokenizeCooldown from now.
func (c *tokenizerCooling) add(endpoint string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.until == nil {
		c.until = map[string]time.Time{}
	}
	for ep, t := range c.until {
		if now.After(t) {
			delete(c.until, ep)
		}
	}
	c.until[endpoint] = now.Add(tokenizeCooldown)
	c.n.Store(int32(len(c.until)))
}

// order appends to out up to cap(out) of endpoints, taking turns from
// first: those not cooling first, then those cooling, so a request still
// has a worker to ask when all of them failed lately.
func (c *tokenizerCooling) order(endpoints []string, first uint64, out []string, now time.Time) []string {
	n := uint64(len(endpoints))
	if c.n.Load() == 0 {
		for i := range min(n, uint64(cap(out))) {
			out = append(out, endpoints[(first+i)%n])
		}
		return out
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cooling := range [2]bool{false, true} {
		for i := range n {
			if len(out) == cap(out) {
				return out
			}
			ep := endpoints[(first+i)%n]
			if t, ok := c.until[ep]; (ok && now.Before(t)) == cooling {
				out = append(out, ep)
			}
		}
	}
	return out
}
