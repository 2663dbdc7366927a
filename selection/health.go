package selection

import (
	"net"
	"sync"
	"time"
)

// Worker health: a worker that the proxy cannot reach, and that has not
// answered since, is taken out of the candidates once WorkerDownAfter has
// passed, and its index entries are dropped (its cache is presumed gone).
// While it is down, a TCP dial to its endpoint is tried on every sweep; the
// first that connects brings it back (with an empty index, filled again by
// its events or bookings).

type workerHealth struct {
	failingSince time.Time // first failure since the last success
	down         bool
}

type healthTable struct {
	mu      sync.Mutex
	workers map[uint64]*workerHealth
}

// ReportFailure records that a worker could not be reached (a dial error
// or an upstream failure seen by the proxy).
func (r *Router) ReportFailure(workerID uint64) {
	h := &r.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.workers == nil {
		h.workers = map[uint64]*workerHealth{}
	}
	w := h.workers[workerID]
	if w == nil {
		w = &workerHealth{}
		h.workers[workerID] = w
	}
	if w.failingSince.IsZero() {
		w.failingSince = r.now()
	}
}

// ReportSuccess records that a worker answered; it clears its failures.
func (r *Router) ReportSuccess(workerID uint64) {
	h := &r.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if w := h.workers[workerID]; w != nil && !w.down {
		delete(h.workers, workerID)
	}
}

// forget drops a worker's failure history.
func (h *healthTable) forget(id uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.workers, id)
}

// WorkerDown reports whether the router has taken a worker out as
// unreachable.
func (r *Router) WorkerDown(workerID uint64) bool {
	h := &r.health
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.workers[workerID]
	return w != nil && w.down
}

// sweepHealth takes out workers failing for longer than WorkerDownAfter
// and brings back the down ones that accept a connection again.
func (r *Router) sweepHealth() {
	grace := r.cfg.WorkerDownAfter
	if grace <= 0 {
		return
	}
	now := r.now()
	var takeOut, probe []uint64
	h := &r.health
	h.mu.Lock()
	for id, w := range h.workers {
		switch {
		case w.down:
			probe = append(probe, id)
		case !w.failingSince.IsZero() && now.Sub(w.failingSince) >= grace:
			w.down = true
			takeOut = append(takeOut, id)
		}
	}
	h.mu.Unlock()
	for _, id := range takeOut {
		r.setDown(id, true)
	}
	for _, id := range probe {
		rec, ok := r.Worker(id)
		if !ok {
			h.mu.Lock()
			delete(h.workers, id) // deleted from the catalog meanwhile
			h.mu.Unlock()
			continue
		}
		if rec.Endpoint == nil || !dialable(*rec.Endpoint, grace/4) {
			continue
		}
		h.mu.Lock()
		delete(h.workers, id)
		h.mu.Unlock()
		r.setDown(id, false)
	}
}

// setDown marks a worker's ranks down (out of the candidates, index
// entries dropped) or up again.
func (r *Router) setDown(id uint64, down bool) {
	rec, ok := r.Worker(id)
	if !ok {
		return
	}
	key := rec.Partition()
	if p := r.partition(key); p != nil {
		p.mu.Lock()
		for _, rs := range p.ranks {
			if rs.rank.WorkerID == id {
				rs.down = down
			}
		}
		p.mu.Unlock()
	}
	if down {
		r.index.RemoveWorker(key, id)
	}
}

// dialable reports whether a TCP connection to endpoint (host:port, an
// optional scheme ignored) succeeds within timeout.
func dialable(endpoint string, timeout time.Duration) bool {
	c, err := net.DialTimeout("tcp", HostPort(endpoint), max(timeout, 100*time.Millisecond))
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}
