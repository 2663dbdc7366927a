package selection

// Worker-health observations shared between replicas (docs/replicas.md):
// a worker one replica takes out (it failed requests for WorkerDownAfter)
// or brings back (its /health answered) is told to a HealthSink, which
// tells the others; they apply it with ObservedByPeer, which tells no
// sink, so an observation is shared once.

// HealthSink hears this router's own health decisions. It is called on
// the health sweep, outside the health lock: it must not block and must
// not call back into the router.
type HealthSink interface {
	WorkerHealth(id uint64, down bool)
}

// healthOut is the health tracker's link to its sink; the zero value has none.
type healthOut struct{ sinkSlot[HealthSink] }

// SetSink makes h tell s about every worker it takes out or brings back;
// nil stops it.
func (h *Health) SetSink(s HealthSink) {
	h.out.set(s)
}

// ClearSink stops telling s (and only s: a sink set since stays).
func (h *Health) ClearSink(s HealthSink) {
	h.out.clear(s)
}

// shared tells the sink, if any, of a decision this router made.
func (h *Health) shared(id uint64, down bool) {
	if sink := h.out.get(); sink != nil {
		sink.WorkerHealth(id, down)
	}
}

// ObservedByPeer applies another replica's observation of a worker in
// the catalog. Down makes it a suspect, which this router's next sweep
// probes: a worker whose /health fails is taken out here too (and
// brought back by the same probe once it answers, as one taken out here);
// one that answers stays. A peer's word alone took it out, and its index
// entries with it: one message (a replica cut off from the workers while
// they serve the others, or anyone who can publish on the cluster's
// subjects) took every worker out on every replica until its probe ran.
// Up brings back a worker that is down here. With the health sweep off
// (WorkerDownAfter 0) nothing would probe a worker, so observations are
// ignored.
func (h *Health) ObservedByPeer(id uint64, down bool) {
	if h.cfg.get().WorkerDownAfter <= 0 {
		return
	}
	if _, ok := h.catalog.Worker(id); !ok {
		return
	}
	h.mu.Lock()
	if h.workers == nil {
		h.workers = map[uint64]*workerHealth{}
	}
	w := h.workers[id]
	switch {
	case down && (w == nil || !w.down):
		if w == nil {
			w = &workerHealth{}
			h.workers[id] = w
		}
		w.suspect = true
		h.mu.Unlock()
		return // the sweep's probe decides
	case !down && w != nil && w.down:
		delete(h.workers, id)
	default:
		h.mu.Unlock()
		return // already so here
	}
	h.mu.Unlock()
	h.setDown(id, down, true)
}

// settleSuspect applies a sweep's probe of w, when w is a suspect still
// (a peer said it is down, and it is not down here): taken out on the
// peer's word when the probe failed, cleared when it answered. It reports
// whether w was a suspect.
func (h *Health) settleSuspect(id uint64, w *workerHealth, healthy bool) bool {
	h.mu.Lock()
	if h.workers[id] != w || !w.suspect || w.down {
		h.mu.Unlock()
		return false
	}
	w.suspect = false
	if healthy {
		if w.failingSince.IsZero() {
			delete(h.workers, id)
		}
		h.mu.Unlock()
		return true
	}
	w.down, w.byPeer = true, true
	h.mu.Unlock()
	h.setDown(id, true, true)
	return true
}

// TakenOutHere lists the workers this router took out itself and holds
// out still. A replica announcing afresh (after an outage, a full queue,
// or another replica's hello) tells them again: the decision went out
// once, and a replica that could not hear it then would otherwise keep
// sending requests to the worker until its own grace ran out.
func (h *Health) TakenOutHere() []uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []uint64
	for id, w := range h.workers {
		if w.down && !w.byPeer {
			out = append(out, id)
		}
	}
	return out
}
