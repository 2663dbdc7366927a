package selection

import (
	"cmp"
	"slices"
)

// ServedModel is one model the catalog's schedulable workers serve: a
// base model, or a LoRA adapter with the base model it runs on.
type ServedModel struct {
	// ID is the name a request gives as its model.
	ID string
	// Parent is an adapter's base model; empty for a base model.
	Parent string
	// MaxModelLen is the smallest context length the model's workers
	// report, in tokens (a prompt that fits it fits any of them); 0 when
	// none reports one.
	MaxModelLen uint64
}

// ServedModels lists every base model that a schedulable worker serves,
// once, sorted by name, then every adapter such a worker serves, once,
// sorted by name, with the base model its requests are routed to
// (AdapterBase; an adapter whose name is a base model's is that model).
// It is what GET /v1/models answers.
func (c *Catalog) ServedModels() []ServedModel {
	bases := map[string]uint64{}
	adapters := map[string]bool{}
	c.mu.RLock()
	for _, w := range c.workers {
		if !w.Schedulable() {
			continue
		}
		n, seen := bases[w.ModelName]
		if l := deref(w.MaxModelLen); !seen || n == 0 || l > 0 && l < n {
			bases[w.ModelName] = l
		}
		for _, a := range w.LoraAdapters {
			adapters[a] = true
		}
	}
	c.mu.RUnlock()
	out := make([]ServedModel, 0, len(bases)+len(adapters))
	for id, l := range bases {
		out = append(out, ServedModel{ID: id, MaxModelLen: l})
	}
	slices.SortFunc(out, func(a, b ServedModel) int { return cmp.Compare(a.ID, b.ID) })
	n := len(out)
	for a := range adapters {
		// The routes say where a request for it goes; a name they do not
		// route is a base model's (perhaps one with no schedulable worker).
		if base, ok := c.AdapterBase(a); ok {
			out = append(out, ServedModel{ID: a, Parent: base})
		}
	}
	slices.SortFunc(out[n:], func(a, b ServedModel) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// OnlyModel returns the model every worker of the catalog serves, when
// they all serve one (schedulable or not); ok is false for an empty
// catalog or several models. vLLM serves a request that names no model
// with its own, and a gateway in front of one model does the same.
func (c *Catalog) OnlyModel() (model string, ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if len(c.models) != 1 {
		return "", false
	}
	for m := range c.models {
		model = m
	}
	return model, true
}
