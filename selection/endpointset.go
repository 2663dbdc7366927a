package selection

import (
	"slices"
	"sync/atomic"
)

// endpointSet versions the schedulable workers' endpoints, what a proxy's
// list of upstreams is made of: most catalog writes (a worker's engine
// facts, its taints, a patch of another field) leave it as it was, and a
// list made again on each of them cost every request under churn.
type endpointSet struct {
	version atomic.Uint64
}

// served is the endpoint w is reached at as an upstream, "" when it is
// none (not schedulable, or no endpoint).
func served(w *WorkerRecord) string {
	if w == nil || !w.Schedulable() {
		return ""
	}
	return endpointOf(w)
}

// note bumps the version when a write of cur over old (either nil)
// changes what is served, and on every delete (cur nil: the deleted
// record comes marked unschedulable, whatever it was). It runs under
// writeMu, after the change is visible to readers.
func (s *endpointSet) note(old, cur *WorkerRecord) {
	if cur == nil || served(old) != served(cur) {
		s.version.Add(1)
	}
}

// EndpointsVersion changes whenever a schedulable worker's endpoint comes
// or goes (SchedulableEndpoints would answer otherwise). Read it before
// the endpoints: a list made of endpoints newer than its version is made
// again, never the reverse.
func (c *Catalog) EndpointsVersion() uint64 { return c.endpoints.version.Load() }

// SchedulableEndpoints appends the schedulable workers' endpoints to dst,
// in worker id order, as they were written (one per worker; workers may
// share one).
func (c *Catalog) SchedulableEndpoints(dst []string) []string {
	type idEndpoint struct {
		id       uint64
		endpoint string
	}
	c.mu.RLock()
	found := make([]idEndpoint, 0, len(c.workers))
	for id, w := range c.workers {
		if ep := served(w); ep != "" {
			found = append(found, idEndpoint{id, ep})
		}
	}
	c.mu.RUnlock()
	slices.SortFunc(found, func(a, b idEndpoint) int {
		switch {
		case a.id < b.id:
			return -1
		case a.id > b.id:
			return 1
		}
		return 0
	})
	for _, f := range found {
		dst = append(dst, f.endpoint)
	}
	return dst
}
