package selection

import (
	"slices"
	"sync"
	"sync/atomic"
)

// Catalog is the worker catalog: the registered workers, the partitions
// their schedulable ranks form, and a version that changes with every
// write. Writes are serialized by writeMu, so they commit (and reach the
// hooks) in order; reads take only mu. The catalog bounds (max_workers,
// max_ranks, field sizes) and the endpoint check are applied here.
type Catalog struct {
	cfg   *liveConfig
	index Indexer // loses a worker's entries when it leaves or moves
	hooks []func(old, cur *WorkerRecord)
	// endpointCheck vets new worker endpoints (WithEndpointCheck).
	endpointCheck func(endpoint string) error
	// forget drops what the rest of the router knows of a replaced
	// server (Router.forgetServer); it runs under writeMu.
	forget func(old *WorkerRecord)
	// shared hears the API's writes, for the other replicas (replica_catalog.go).
	shared catalogOut

	writeMu sync.Mutex    // serializes catalog updates, so they commit in order
	version atomic.Uint64 // bumped on every catalog change
	// modelVersions holds, for each model some worker names, the version
	// of the last change to one of its workers (ModelVersion).
	modelVersions sync.Map // model name → uint64
	// endpoints versions what is served (endpointset.go).
	endpoints endpointSet

	mu      sync.RWMutex
	workers map[uint64]*WorkerRecord
	parts   map[PartitionKey]*partition
	ranks   int            // data-parallel ranks over workers, for MaxRanks
	models  map[string]int // workers per model name, schedulable or not
	// adapters are the LoRA adapters the workers serve, and the lookup
	// the proxy path reads without a lock (adapters.go).
	adapters adapterIndex
}

func newCatalog(cfg *liveConfig) *Catalog {
	return &Catalog{cfg: cfg, workers: make(map[uint64]*WorkerRecord), parts: make(map[PartitionKey]*partition),
		models: make(map[string]int), adapters: newAdapterIndex()}
}

// ServesModel reports whether any worker, schedulable or not, names the
// model: a proxied request for a model nobody serves is the gateway's own
// 404, where one for a served model with no schedulable worker is a 503.
func (c *Catalog) ServesModel(model string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.models[model] > 0
}

// countModel adds n workers to a model's count in models (the catalog's,
// under its mu).
func countModel(models map[string]int, model string, n int) {
	if models[model] += n; models[model] <= 0 {
		delete(models, model)
	}
}

// Version changes whenever the catalog does, so callers can cache what
// they derive from it (reverse_proxy's upstream list).
func (c *Catalog) Version() uint64 { return c.version.Load() }

// partition returns the partition for k, or nil.
func (c *Catalog) partition(k PartitionKey) *partition {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.parts[k]
}

// partitions returns the partitions of model and group (all of them when
// a filter is empty), in no particular order.
func (c *Catalog) partitions(model, group string) []*partition {
	c.mu.RLock()
	defer c.mu.RUnlock()
	parts := make([]*partition, 0, len(c.parts))
	for k, p := range c.parts {
		if (model == "" || k.Model == model) && (group == "" || k.Group == group) {
			parts = append(parts, p)
		}
	}
	return parts
}

// schedulablePartition returns k's partition if it has a schedulable rank.
func (c *Catalog) schedulablePartition(k PartitionKey) (*partition, error) {
	p := c.partition(k)
	if p == nil {
		return nil, errNoSchedulable(k.Model, k.Group)
	}
	p.mu.Lock()
	n := len(p.ranks)
	p.mu.Unlock()
	if n == 0 {
		return nil, errNoSchedulable(k.Model, k.Group)
	}
	return p, nil
}

// Catalog operations (docs/selection-api.md, "Workers"). Updates are
// serialized by writeMu.

// UpsertWorker creates or replaces a worker from req. An incomplete worker
// is accepted (not schedulable, with reasons). A block size or Eagle setting
// that conflicts with the worker's partition is a 409. A write that changes
// a worker's endpoint (here or in PatchWorker) replaces the server: its
// cached prefixes, bookings, session bindings, pending selections and
// failure history are dropped before the new record commits.
//
// An upsert of the same server (the same endpoint) keeps what its engine
// reported (ApplyEngineFacts) for the fields req does not give, so that
// a config reload, which declares its workers again, does not undo them;
// if the record with them cannot be written, the record req alone makes
// is.
func (c *Catalog) UpsertWorker(req *WorkerRequest) (WorkerRecord, error) {
	rec, err := c.cfg.get().recordFor(req)
	if err != nil {
		return WorkerRecord{}, err
	}
	if old, ok := c.Worker(rec.WorkerID); ok && endpointOf(&old) == endpointOf(&rec) {
		carried := rec.clone()
		carried.carryFacts(&old)
		if out, err := c.writeWorker(&carried, true); err == nil {
			return out, nil
		}
	}
	return c.writeWorker(&rec, true)
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
func (c *Catalog) PatchWorker(id uint64, patch *WorkerRequest) (WorkerRecord, error) {
	if err := patch.checkBounds(); err != nil {
		return WorkerRecord{}, err
	}
	c.writeMu.Lock()
	c.mu.RLock()
	old := c.workers[id]
	c.mu.RUnlock()
	if old == nil {
		c.writeMu.Unlock()
		return WorkerRecord{}, errorf(KindNotFound, "worker %d not found", id)
	}
	rec := old.clone()
	c.writeMu.Unlock()
	// A patch changes a worker's fields, never its partition: Dynamo's
	// patch request has no model_name, routing_group or tenant_id, and
	// moving a worker is a POST of its whole record.
	p := *patch
	p.ModelName, p.RoutingGroup, p.TenantID = nil, nil, nil
	rec.applyRequest(&p)
	return c.writeWorker(&rec, false)
}

// writeWorker checks rec, runs the endpoint check (outside the locks: it
// may resolve names) when the endpoint is new, and commits.
func (c *Catalog) writeWorker(rec *WorkerRecord, create bool) (WorkerRecord, error) {
	if err := rec.prepare(c.cfg.get()); err != nil {
		return WorkerRecord{}, err
	}
	checked := ""
	force := false
	for {
		if ep := endpointOf(rec); c.endpointCheck != nil && ep != "" && ep != checked {
			var old *WorkerRecord
			if w, ok := c.Worker(rec.WorkerID); ok {
				old = &w
			}
			if force || c.needsEndpointCheck(old, rec, checked) {
				if err := c.checkEndpoint(ep); err != nil {
					return WorkerRecord{}, err
				}
				checked = ep
			}
		}
		out, err := c.commitWorker(rec, create, checked)
		if err != errEndpointUnchecked {
			return out, err
		}
		force = true // the catalog moved under the check: check this time
	}
}

func (c *Catalog) commitWorker(rec *WorkerRecord, create bool, checked string) (WorkerRecord, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	return c.commitWorkerLocked(rec, create, checked)
}

// commitWorkerLocked is commitWorker with writeMu held.
func (c *Catalog) commitWorkerLocked(rec *WorkerRecord, create bool, checked string) (WorkerRecord, error) {
	c.mu.Lock()
	old := c.workers[rec.WorkerID]
	if !create && old == nil {
		c.mu.Unlock()
		return WorkerRecord{}, errorf(KindNotFound, "worker %d not found", rec.WorkerID)
	}
	ranks, err := c.cfg.get().checkCapacity(len(c.workers), c.ranks, old, rec)
	if err != nil {
		c.mu.Unlock()
		return WorkerRecord{}, err
	}
	if c.needsEndpointCheck(old, rec, checked) {
		c.mu.Unlock()
		return WorkerRecord{}, errEndpointUnchecked
	}
	key := rec.Partition()
	if err := c.checkPartitionLocked(key, rec); err != nil {
		c.mu.Unlock()
		return WorkerRecord{}, err
	}
	moved := old != nil && old.Partition() != key
	renewed := old != nil && endpointOf(old) != endpointOf(rec)
	switch {
	case renewed:
		// Another server: take the old ranks out, forget everything about
		// them (outside c.mu, which the index and bookings do not need;
		// writeMu keeps the checks above valid), then add fresh ranks.
		c.dropRanksLocked(old, nil)
		c.mu.Unlock()
		c.forget(old)
		c.mu.Lock()
	case old != nil:
		keep := map[Rank]bool{}
		if !moved && rec.Schedulable() {
			for _, rk := range rec.Ranks() {
				keep[rk] = true
			}
		}
		c.dropRanksLocked(old, keep)
	}
	if rec.Schedulable() {
		c.addRanksLocked(key, rec)
	}
	stored := rec.clone()
	if old != nil {
		countModel(c.models, old.ModelName, -1)
	}
	countModel(c.models, stored.ModelName, 1)
	c.adapters.recount(old, &stored, c.models)
	c.workers[rec.WorkerID] = &stored
	c.ranks = ranks
	c.mu.Unlock()
	if moved && !renewed {
		c.index.RemoveWorker(old.Partition(), old.WorkerID)
	}
	c.notify(old, &stored)
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
func (c *Catalog) checkPartitionLocked(key PartitionKey, rec *WorkerRecord) error {
	p := c.parts[key]
	if p == nil || rec.BlockSize == nil {
		return nil
	}
	others := false
	for _, w := range c.workers {
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
func (c *Catalog) addRanksLocked(key PartitionKey, rec *WorkerRecord) {
	p := c.parts[key]
	eagle := rec.eagle()
	if p == nil {
		p = &partition{key: key, blockSize: *rec.BlockSize, isEagle: eagle,
			byRank: make(map[Rank]*rankState), load: newLoadTracker()}
		c.parts[key] = p
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
		rs.loadOnly = rec.loadOnly()
	}
	sortRanks(p.ranks)
}

// dropRanksLocked removes old's ranks from its partition, except keep.
func (c *Catalog) dropRanksLocked(old *WorkerRecord, keep map[Rank]bool) {
	p := c.parts[old.Partition()]
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
func (c *Catalog) DeleteWorker(id uint64) (WorkerRecord, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.mu.Lock()
	old := c.workers[id]
	if old == nil {
		c.mu.Unlock()
		return WorkerRecord{}, errorf(KindNotFound, "worker %d not found", id)
	}
	old.Lifecycle = LifecycleDraining
	c.dropRanksLocked(old, nil)
	delete(c.workers, id)
	countModel(c.models, old.ModelName, -1)
	c.adapters.recount(old, nil, c.models)
	c.ranks -= int(old.DataParallelSize)
	c.mu.Unlock()
	c.index.RemoveWorker(old.Partition(), id)
	old.Lifecycle = LifecycleUnschedulable
	old.NotSchedulableReasons = []string{"worker deleted"}
	c.notify(old, nil)
	return old.clone(), nil
}

// ModelVersion changes whenever a worker naming model does (joins,
// leaves or is rewritten), so callers can cache what they derive from a
// model's workers without losing it to every other model's changes. It is
// 0 for a model no worker names; a model that comes back gets a version
// it never had.
func (c *Catalog) ModelVersion(model string) uint64 {
	v, _ := c.modelVersions.Load(model)
	n, _ := v.(uint64)
	return n
}

// notify runs under writeMu, after the change is visible to readers: a
// reader that reads a version and then the workers has workers at least
// as new as the version.
func (c *Catalog) notify(old, cur *WorkerRecord) {
	v := c.version.Add(1)
	c.endpoints.note(old, cur)
	for _, rec := range [2]*WorkerRecord{old, cur} {
		if rec == nil {
			continue
		}
		if c.ServesModel(rec.ModelName) {
			c.modelVersions.Store(rec.ModelName, v)
		} else {
			// No worker names it: not kept, so the map is bounded by the
			// catalog's models.
			c.modelVersions.Delete(rec.ModelName)
		}
	}
	for _, h := range c.hooks {
		h(old, cur)
	}
}

// ListWorkers returns the catalog sorted by worker id, filtered by model
// and group when they are non-empty.
func (c *Catalog) ListWorkers(model, group string) []WorkerRecord {
	c.mu.RLock()
	out := make([]WorkerRecord, 0, len(c.workers))
	for _, w := range c.workers {
		if (model == "" || w.ModelName == model) && (group == "" || w.RoutingGroup == group) {
			out = append(out, w.clone())
		}
	}
	c.mu.RUnlock()
	sortRecords(out)
	return out
}

// Worker returns one catalog record.
func (c *Catalog) Worker(id uint64) (WorkerRecord, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	w := c.workers[id]
	if w == nil {
		return WorkerRecord{}, false
	}
	return w.clone(), true
}

// Ready reports readiness: at least one schedulable worker.
func (c *Catalog) Ready() ReadyResponse {
	ws := c.ListWorkers("", "")
	n := 0
	for i := range ws {
		if ws[i].Schedulable() {
			n++
		}
	}
	return ReadyResponse{Ready: n > 0, SchedulableWorkers: n, Workers: ws}
}
