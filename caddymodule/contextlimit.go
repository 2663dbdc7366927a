package caddymodule

import (
	"sync"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// contextLimits knows, per partition, the longest prompt its workers
// take: the largest max_model_len they reported, 0 when any did not. A
// prompt given as token ids reaches the gateway whole (up to the body's
// bound, some 4 million ids); one longer than that the engine refuses
// with a 400, so hashing it, scoring it and booking its blocks (in
// approximate mode, recording them as cached for approx_ttl) would be
// work for an answer known in advance, and in approximate mode a wrong
// one. The figures are kept until the catalog changes, so the request
// path reads no worker records.
type contextLimits struct {
	catalog *selection.Catalog

	mu      sync.Mutex
	version uint64 // the catalog's version the figures are of
	byPart  map[selection.PartitionKey]uint64
}

func newContextLimits(c *selection.Catalog) *contextLimits {
	return &contextLimits{catalog: c, byPart: make(map[selection.PartitionKey]uint64)}
}

// of is part's longest prompt, 0 when unknown (no bound then).
func (c *contextLimits) of(part selection.PartitionKey) uint64 {
	if c == nil {
		return 0
	}
	v := c.catalog.Version()
	c.mu.Lock()
	defer c.mu.Unlock()
	if v != c.version {
		clear(c.byPart)
		c.version = v
	}
	if l, ok := c.byPart[part]; ok {
		return l
	}
	workers := c.catalog.ListWorkers(part.Model, part.Group)
	if len(workers) == 0 {
		// Not kept: the partition is a client's name until a worker
		// serves it, and names would grow the map without bound.
		return 0
	}
	var longest uint64
	for _, w := range workers {
		if w.MaxModelLen == nil || *w.MaxModelLen == 0 {
			longest = 0
			break
		}
		longest = max(longest, *w.MaxModelLen)
	}
	c.byPart[part] = longest
	return longest
}

// overContext says whether a prompt of n tokens is longer than any of
// part's workers takes.
func (c *contextLimits) overContext(part selection.PartitionKey, n int) bool {
	l := c.of(part)
	return l > 0 && uint64(n) > l
}
