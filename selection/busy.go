package selection

import "time"

// Overload: a worker is busy when it is past one of the configured busy
// thresholds, when it holds as many reservations as
// max_reservations_per_rank allows, or when it said so itself (an
// "overloaded" answer, marked by Health.ReportBusy for as long as it
// asked). A caller that finds every worker of a partition busy holds the
// request back (the gateway's overload queue) instead of piling it onto
// a worker that would only queue it.
//
// The thresholds follow Dynamo's busy checks: a rank is decode-busy when
// its active decode blocks pass DecodeBusyThreshold × its total KV blocks,
// and prefill-busy when its active prefill tokens pass
// PrefillBusyThreshold × its max_num_batched_tokens. A threshold whose
// capacity the worker did not report is not applied to it.

// ReportBusy marks a worker busy for d: it answered that it is
// overloaded (429, or 503 with Retry-After). A busy worker is not a
// failed one: its failures and down state are untouched, and it is still
// a candidate; only PartitionBusy reads the mark. A later mark replaces
// an earlier one only when it lasts longer.
func (h *Health) ReportBusy(workerID uint64, d time.Duration) {
	if d <= 0 {
		return
	}
	until := h.now().Add(d)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.busy == nil {
		h.busy = map[uint64]time.Time{}
	}
	if until.After(h.busy[workerID]) {
		h.busy[workerID] = until
	}
}

// MarkedBusy reports whether a worker's own busy mark is still running.
func (h *Health) MarkedBusy(workerID uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	until, ok := h.busy[workerID]
	return ok && h.now().Before(until)
}

// busyMarks returns the workers whose marks still run, dropping the
// expired ones; nil when there are none.
func (h *Health) busyMarks() map[uint64]bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.busy) == 0 {
		return nil
	}
	now := h.now()
	out := make(map[uint64]bool, len(h.busy))
	for id, until := range h.busy {
		if now.Before(until) {
			out[id] = true
		} else {
			delete(h.busy, id)
		}
	}
	return out
}

// PartitionBusy reports whether every rank of the partition that could
// take a request placed as pl (not down; when pl is not nil, among its
// AllowedSet and with its required taints, as Reserve filters) is busy,
// and whether the partition exists. A request that may go only to some
// workers (a long prompt to those whose context fits it, an adapter's to
// those serving it) waits for them, however idle the others. A partition
// with no such rank, or none at all, is not busy: Reserve answers for it
// (404 or 503). It stops at the first rank that is not busy, so outside
// overload it reads one rank.
func (r *Router) PartitionBusy(part Partition, pl *Placement) (busy, exists bool) {
	p := r.catalog.partition(part.Key())
	if p == nil {
		return false, false
	}
	var allowed map[uint64]bool
	var required []string
	if pl != nil {
		allowed = pl.AllowedSet
		if pl.RoutingConstraints != nil {
			required = pl.RoutingConstraints.RequiredTaints
		}
	}
	marks := r.health.busyMarks() // before p.mu: Health.mu is taken alone
	cfg := r.cfg.get()
	p.mu.Lock()
	defer p.mu.Unlock()
	eligible := 0
	for _, rs := range p.ranks {
		if rs.down || allowed != nil && !allowed[rs.rank.WorkerID] || !hasAll(rs.taints, required) {
			continue
		}
		eligible++
		if !marks[rs.rank.WorkerID] && !rs.busy(cfg) {
			return false, true
		}
	}
	return eligible > 0, true
}

// busy reports whether the rank is past a busy threshold or full. p.mu
// must be held.
func (rs *rankState) busy(cfg *Config) bool {
	if rs.full(cfg) {
		return true
	}
	if t := cfg.DecodeBusyThreshold; t != nil && rs.totalKV > 0 &&
		float64(rs.decodeBlocks()) > *t*float64(rs.totalKV) {
		return true
	}
	if t := cfg.PrefillBusyThreshold; t != nil && rs.maxBatched > 0 &&
		float64(rs.prefillTokens) > *t*float64(rs.maxBatched) {
		return true
	}
	return false
}
