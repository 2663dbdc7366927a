package caddymodule

import (
	"sync"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// modelSet answers, per request and without copying the catalog, whether
// any catalog worker serves a model: a request for a model nobody serves
// gets the gateway's own 404 instead of reaching a worker of another model
// through the fallback policy. The set is rebuilt only when the catalog's
// version changes, as dynamic kv_router's upstream list is.
type modelSet struct {
	router *selection.Router

	mu      sync.RWMutex
	version uint64
	models  map[string]struct{}
}

func newModelSet(r *selection.Router) *modelSet {
	return &modelSet{router: r, version: ^uint64(0)}
}

// serves reports whether a catalog worker, schedulable or not, names the
// model ("" stands for the catalog's "default" model, as in selections).
func (m *modelSet) serves(model string) bool {
	if model == "" {
		model = "default"
	}
	v := m.router.Catalog().Version()
	m.mu.RLock()
	if m.version == v {
		_, ok := m.models[model]
		m.mu.RUnlock()
		return ok
	}
	m.mu.RUnlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.version != v {
		models := map[string]struct{}{}
		for _, w := range m.router.Catalog().ListWorkers("", "") {
			models[w.ModelName] = struct{}{}
		}
		m.models, m.version = models, v
	}
	_, ok := m.models[model]
	return ok
}
