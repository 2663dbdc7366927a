package selection

import (
	"cmp"
	"maps"
	"slices"
	"sync/atomic"
)

// LoRA adapters (docs/engine-facts.md). An engine serves an adapter
// beside its base model, under the adapter's own name: a request names
// the adapter as its model. The router keeps such a request in the base
// model's partition (the adapter's blocks are cached by the base model's
// engines, hashed with the adapter's name as salt, SaltedSeed), and sends
// it only to the workers that serve the adapter: each carries one taint
// per adapter (AdapterTaint), which the request requires.

// AdapterTaint is the taint of a worker that serves the LoRA adapter
// name; a request for the adapter requires it (RoutingConstraints).
func AdapterTaint(name string) string { return "kvrouter.lora/" + name }

// ServesAdapter reports whether the worker serves the LoRA adapter name.
func (w *WorkerRecord) ServesAdapter(name string) bool {
	_, found := slices.BinarySearch(w.LoraAdapters, name)
	return found
}

// adapterKey is one adapter under one base model.
type adapterKey struct{ adapter, base string }

// adapterIndex counts the workers, schedulable or not, that serve each
// adapter under each base model, as Catalog.models counts the workers of
// a model, and publishes which base model each adapter name resolves to
// as a map the proxy path reads without taking the catalog's lock.
type adapterIndex struct {
	counts map[adapterKey]int         // under Catalog.mu
	routes atomic.Pointer[adapterMap] // replaced whole when counts change
}

// adapterMap maps an adapter name to its base model.
type adapterMap map[string]string

func newAdapterIndex() adapterIndex {
	return adapterIndex{counts: map[adapterKey]int{}}
}

// recount moves the adapters of old (nil for a new worker) to those of
// cur (nil for a deleted one), with Catalog.mu held for writing and models
// already counted. The routes are rebuilt when the worker's adapters or
// its model changed, and when a model name may have come or gone while
// there are adapters: a base model's name is never an adapter's.
func (x *adapterIndex) recount(old, cur *WorkerRecord, models map[string]int) {
	for _, w := range []struct {
		rec *WorkerRecord
		n   int
	}{{old, -1}, {cur, 1}} {
		if w.rec == nil {
			continue
		}
		for _, a := range w.rec.LoraAdapters {
			k := adapterKey{a, w.rec.ModelName}
			if x.counts[k] += w.n; x.counts[k] <= 0 {
				delete(x.counts, k)
			}
		}
	}
	modelMoved := old == nil || cur == nil || old.ModelName != cur.ModelName
	adaptersMoved := old != nil && len(old.LoraAdapters) > 0 || cur != nil && len(cur.LoraAdapters) > 0
	if !modelMoved && slices.Equal(old.LoraAdapters, cur.LoraAdapters) {
		adaptersMoved = false
	}
	if adaptersMoved || modelMoved && len(x.counts) > 0 {
		x.rebuild(models)
	}
}

// rebuild publishes the routes: each adapter name to the base model most
// of its workers serve it under (the smaller name on a tie), leaving out a
// name that is also a base model's, which names the base model.
func (x *adapterIndex) rebuild(models map[string]int) {
	best := map[string]adapterKey{}
	for _, k := range slices.SortedFunc(maps.Keys(x.counts), func(a, b adapterKey) int {
		return cmp.Or(cmp.Compare(a.adapter, b.adapter), cmp.Compare(a.base, b.base))
	}) {
		if models[k.adapter] > 0 {
			continue
		}
		if cur, ok := best[k.adapter]; !ok || x.counts[k] > x.counts[cur] {
			best[k.adapter] = k
		}
	}
	m := make(adapterMap, len(best))
	for a, k := range best {
		m[a] = k.base
	}
	x.routes.Store(&m)
}

// AdapterBase returns the base model of the LoRA adapter name when a
// catalog worker, schedulable or not, serves it and no worker serves a
// base model of that name. It takes no lock: the proxy path asks it of
// every request.
func (c *Catalog) AdapterBase(name string) (string, bool) {
	m := c.adapters.routes.Load()
	if m == nil {
		return "", false
	}
	base, ok := (*m)[name]
	return base, ok
}
