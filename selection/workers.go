package selection

import (
	"slices"
)

// Catalog operations (spec §1.4.5). Updates are serialized by catalogMu.

// UpsertWorker creates or replaces a worker from req. An incomplete worker
// is accepted (not schedulable, with reasons). A block size or Eagle setting
// that conflicts with the worker's partition is a 409. A write that changes
// a worker's endpoint (here or in PatchWorker) replaces the server: its
// cached prefixes, bookings, session bindings, pending selections and
// failure history are dropped before the new record commits.
func (r *Router) UpsertWorker(req *WorkerRequest) (WorkerRecord, error) {
	rec, err := r.cfg.recordFor(req)
	if err != nil {
		return WorkerRecord{}, err
	}
	return r.writeWorker(&rec, true)
}

// recordFor is the record an upsert of req creates: the catalog's defaults
// with req's fields applied. CheckWorkers builds its records here too.
func (c *Config) recordFor(req *WorkerRequest) (WorkerRecord, error) {
	if req.WorkerID == nil {
		return WorkerRecord{}, errorf(KindUnprocessable, "missing field `worker_id`")
	}
	if err := req.checkBounds(); err != nil {
		return WorkerRecord{}, err
	}
	rec := newWorkerRecord(*req.WorkerID, c)
	rec.applyRequest(req)
	return rec, nil
}

// PatchWorker changes only the fields present in patch. The merged record
// is checked as a whole, so a patch can neither raise data_parallel_size
// past its bounds nor leave kv_events_endpoints naming ranks it dropped.
func (r *Router) PatchWorker(id uint64, patch *WorkerRequest) (WorkerRecord, error) {
	if err := patch.checkBounds(); err != nil {
		return WorkerRecord{}, err
	}
	r.catalogMu.Lock()
	r.mu.RLock()
	old := r.workers[id]
	r.mu.RUnlock()
	if old == nil {
		r.catalogMu.Unlock()
		return WorkerRecord{}, errorf(KindNotFound, "worker %d not found", id)
	}
	rec := old.clone()
	r.catalogMu.Unlock()
	rec.applyRequest(patch)
	return r.writeWorker(&rec, false)
}

// writeWorker checks rec, runs the endpoint check (outside the locks: it
// may resolve names) when the endpoint is new, and commits.
func (r *Router) writeWorker(rec *WorkerRecord, create bool) (WorkerRecord, error) {
	if err := rec.prepare(&r.cfg); err != nil {
		return WorkerRecord{}, err
	}
	checked := ""
	force := false
	for {
		if ep := endpointOf(rec); r.endpointCheck != nil && ep != "" && ep != checked {
			var old *WorkerRecord
			if w, ok := r.Worker(rec.WorkerID); ok {
				old = &w
			}
			if force || r.needsEndpointCheck(old, rec, checked) {
				if err := r.checkEndpoint(ep); err != nil {
					return WorkerRecord{}, err
				}
				checked = ep
			}
		}
		out, err := r.commitWorker(rec, create, checked)
		if err != errEndpointUnchecked {
			return out, err
		}
		force = true // the catalog moved under the check: check this time
	}
}

func (r *Router) commitWorker(rec *WorkerRecord, create bool, checked string) (WorkerRecord, error) {
	r.catalogMu.Lock()
	defer r.catalogMu.Unlock()
	r.mu.Lock()
	old := r.workers[rec.WorkerID]
	if !create && old == nil {
		r.mu.Unlock()
		return WorkerRecord{}, errorf(KindNotFound, "worker %d not found", rec.WorkerID)
	}
	ranks, err := r.cfg.checkCapacity(len(r.workers), r.ranks, old, rec)
	if err != nil {
		r.mu.Unlock()
		return WorkerRecord{}, err
	}
	if r.needsEndpointCheck(old, rec, checked) {
		r.mu.Unlock()
		return WorkerRecord{}, errEndpointUnchecked
	}
	key := rec.Partition()
	if err := r.checkPartitionLocked(key, rec); err != nil {
		r.mu.Unlock()
		return WorkerRecord{}, err
	}
	moved := old != nil && old.Partition() != key
	renewed := old != nil && endpointOf(old) != endpointOf(rec)
	switch {
	case renewed:
		// Another server: take the old ranks out, forget everything about
		// them (outside r.mu, which the index and bookings do not need;
		// catalogMu keeps the checks above valid), then add fresh ranks.
		r.dropRanksLocked(old, nil)
		r.mu.Unlock()
		r.forgetServer(old)
		r.mu.Lock()
	case old != nil:
		keep := map[Rank]bool{}
		if !moved && rec.Schedulable() {
			for _, rk := range rec.Ranks() {
				keep[rk] = true
			}
		}
		r.dropRanksLocked(old, keep)
	}
	if rec.Schedulable() {
		r.addRanksLocked(key, rec)
	}
	stored := rec.clone()
	r.workers[rec.WorkerID] = &stored
	r.ranks = ranks
	r.mu.Unlock()
	if moved && !renewed {
		r.index.RemoveWorker(old.Partition(), old.WorkerID)
	}
	r.notify(old, &stored)
	return stored.clone(), nil
}

// checkCapacity checks a write of rec over old (nil for a new worker) into
// a catalog of the given size against max_workers and max_ranks, and
// returns the catalog's rank count after it. A write that does not add
// ranks passes even over max_ranks, so a catalog above a lowered bound can
// still be edited.
func (c *Config) checkCapacity(workers, ranks int, old, rec *WorkerRecord) (int, error) {
	if old == nil && c.MaxWorkers > 0 && workers >= c.MaxWorkers {
		return ranks, errorf(KindConflict, "worker catalog is full (%d workers)", c.MaxWorkers)
	}
	next := ranks + int(rec.DataParallelSize)
	if old != nil {
		next -= int(old.DataParallelSize)
	}
	if c.MaxRanks > 0 && next > c.MaxRanks && next > ranks {
		return ranks, errorf(KindConflict, "worker catalog is full: %d data-parallel ranks with this worker, more than max_ranks %d",
			next, c.MaxRanks)
	}
	return next, nil
}

// checkPartitionLocked enforces one block size and one Eagle setting per
// partition; the first worker sets them.
func (r *Router) checkPartitionLocked(key PartitionKey, rec *WorkerRecord) error {
	p := r.parts[key]
	if p == nil || rec.BlockSize == nil {
		return nil
	}
	others := false
	for _, w := range r.workers {
		if w.WorkerID != rec.WorkerID && w.Partition() == key && w.Schedulable() {
			others = true
			break
		}
	}
	if !others {
		return nil
	}
	return partitionConflict(key, p.blockSize, p.isEagle, rec)
}

// partitionConflict refuses a record whose block size or Eagle setting is
// not the one the other workers of its partition share: a prompt is hashed
// once per partition, with that block size and Eagle window.
func partitionConflict(key PartitionKey, blockSize uint32, isEagle bool, rec *WorkerRecord) error {
	if *rec.BlockSize != blockSize {
		return errorf(KindConflict, "block_size %d conflicts with block_size %d of the other workers of %s", *rec.BlockSize, blockSize, key)
	}
	if eagle := rec.eagle(); eagle != isEagle {
		return errorf(KindConflict, "is_eagle %t conflicts with is_eagle %t of the other workers of %s", eagle, isEagle, key)
	}
	return nil
}

// addRanksLocked makes rec's ranks schedulable in its partition, keeping
// the live state of ranks that were already there.
func (r *Router) addRanksLocked(key PartitionKey, rec *WorkerRecord) {
	p := r.parts[key]
	eagle := rec.eagle()
	if p == nil {
		p = &partition{key: key, blockSize: *rec.BlockSize, isEagle: eagle,
			byRank: make(map[Rank]*rankState), load: newLoadTracker()}
		r.parts[key] = p
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	alone := true
	for _, rs := range p.ranks {
		alone = alone && rs.rank.WorkerID == rec.WorkerID
	}
	if alone {
		p.blockSize, p.isEagle = *rec.BlockSize, eagle
	}
	taints := rec.effectiveTaints()
	for _, rk := range rec.Ranks() {
		rs := p.byRank[rk]
		if rs == nil {
			rs = &rankState{rank: rk}
			p.byRank[rk] = rs
			p.ranks = append(p.ranks, rs)
		}
		rs.endpoint = *rec.Endpoint
		rs.maxBatched, rs.totalKV = deref(rec.MaxNumBatchedTokens), deref(rec.TotalKVBlocks)
		rs.taints = taints
	}
	sortRanks(p.ranks)
}

// dropRanksLocked removes old's ranks from its partition, except keep.
func (r *Router) dropRanksLocked(old *WorkerRecord, keep map[Rank]bool) {
	p := r.parts[old.Partition()]
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ranks = slices.DeleteFunc(p.ranks, func(rs *rankState) bool {
		if rs.rank.WorkerID != old.WorkerID || keep[rs.rank] {
			return false
		}
		rs.removed = true
		delete(p.byRank, rs.rank)
		return true
	})
	sortRanks(p.ranks)
}

func deref(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}

// DeleteWorker drains a worker: it leaves the candidate set, its index
// entries are dropped, and its record is returned as unschedulable.
func (r *Router) DeleteWorker(id uint64) (WorkerRecord, error) {
	r.catalogMu.Lock()
	defer r.catalogMu.Unlock()
	r.mu.Lock()
	old := r.workers[id]
	if old == nil {
		r.mu.Unlock()
		return WorkerRecord{}, errorf(KindNotFound, "worker %d not found", id)
	}
	old.Lifecycle = LifecycleDraining
	r.dropRanksLocked(old, nil)
	delete(r.workers, id)
	r.ranks -= int(old.DataParallelSize)
	r.mu.Unlock()
	r.index.RemoveWorker(old.Partition(), id)
	old.Lifecycle = LifecycleUnschedulable
	old.NotSchedulableReasons = []string{"worker deleted"}
	r.notify(old, nil)
	return old.clone(), nil
}

func (r *Router) notify(old, cur *WorkerRecord) {
	r.version.Add(1)
	for _, h := range r.hooks {
		h(old, cur)
	}
}

// ListWorkers returns the catalog sorted by worker id, filtered by model
// and group when they are non-empty.
func (r *Router) ListWorkers(model, group string) []WorkerRecord {
	r.mu.RLock()
	out := make([]WorkerRecord, 0, len(r.workers))
	for _, w := range r.workers {
		if (model == "" || w.ModelName == model) && (group == "" || w.RoutingGroup == group) {
			out = append(out, w.clone())
		}
	}
	r.mu.RUnlock()
	sortRecords(out)
	return out
}

// Worker returns one catalog record.
func (r *Router) Worker(id uint64) (WorkerRecord, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	w := r.workers[id]
	if w == nil {
		return WorkerRecord{}, false
	}
	return w.clone(), true
}

// Ready reports readiness: at least one schedulable worker.
func (r *Router) Ready() ReadyResponse {
	ws := r.ListWorkers("", "")
	n := 0
	for i := range ws {
		if ws[i].Schedulable() {
			n++
		}
	}
	return ReadyResponse{Ready: n > 0, SchedulableWorkers: n, Workers: ws}
}
