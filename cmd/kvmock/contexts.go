package main

import (
	"fmt"
	"strconv"
	"strings"
)

// contextOf is worker id's max_model_len: its --max-model-len-of entry,
// else --max-model-len. A fleet of engines started with different
// contexts is what a gateway must route a long prompt through.
func (c *Config) contextOf(id int) int {
	if l, ok := c.MaxModelLenOf[id]; ok {
		return l
	}
	return c.MaxModelLen
}

// parseContexts reads --max-model-len-of: id=tokens pairs separated by
// commas.
func parseContexts(s string) (map[int]int, error) {
	out := map[int]int{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		id, n, ok := strings.Cut(f, "=")
		wid, err1 := strconv.Atoi(id)
		l, err2 := strconv.Atoi(n)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("--max-model-len-of wants id=tokens pairs, not %q", f)
		}
		out[wid] = l
	}
	return out, nil
}

// validateContexts checks --max-model-len-of against the fleet.
func (c *Config) validateContexts() error {
	for id, l := range c.MaxModelLenOf {
		if id < 1 || id > c.Workers {
			return fmt.Errorf("--max-model-len-of: no worker %d (ids are 1..%d)", id, c.Workers)
		}
		if l < 2 {
			return fmt.Errorf("--max-model-len-of: worker %d's context must be at least 2", id)
		}
	}
	return nil
}
