package selection

import (
	"errors"
	"fmt"
)

// CheckWorkers is a dry run of declaring reqs, a set of distinct workers,
// in a router built with c: it upserts them, in order, into an empty
// catalog of its own and returns the first error, naming the worker
// ("worker 3: …", or "workers[2]: …" for one without an id). It never
// touches a Router, so a caller that holds a shared one (the Caddy app
// across reloads) can refuse a bad declaration before changing anything.
//
// It refuses what UpsertWorker refuses (a missing worker_id, a field past
// its bound, a catalog past max_workers or max_ranks, a block size or Eagle
// setting that conflicts with its partition), a worker id given twice, and
// a worker the catalog would hold only as incomplete for want of something
// in its own declaration: an endpoint, a block size (neither its own nor
// c.DefaultBlockSize), or a replay endpoint on more than one rank. A
// declaration is the complete worker, so an incomplete one is a mistake,
// while the API accepts one to be completed by later patches.
//
// The declared workers of a partition must agree with each other even where
// the catalog would not compare them yet (a worker waiting for its KV-event
// endpoints is not schedulable, so it sets no block size): they would
// conflict as soon as both were schedulable. Missing or malformed KV-event
// endpoints themselves are not refused; the catalog lists them among the
// worker's reasons. What needs the live router is not checked either: the
// endpoint check (WithEndpointCheck) and the workers already in it.
func (c *Config) CheckWorkers(reqs []*WorkerRequest) error {
	d := dryCatalog{cfg: c, ids: make(map[uint64]bool, len(reqs)), first: make(map[PartitionKey]*WorkerRecord)}
	for i, req := range reqs {
		if err := d.add(req); err != nil {
			name := fmt.Sprintf("workers[%d]", i)
			if req.WorkerID != nil {
				name = fmt.Sprintf("worker %d", *req.WorkerID)
			}
			return &Error{Kind: err.Kind, Msg: name + ": " + err.Msg}
		}
	}
	return nil
}

// dryCatalog is what CheckWorkers keeps of the workers declared so far.
type dryCatalog struct {
	cfg   *Config
	ids   map[uint64]bool
	first map[PartitionKey]*WorkerRecord // the worker that set each partition
	ranks int
}

// add checks one declared worker against the catalog's rules and the
// workers declared before it, and adds it to them.
func (d *dryCatalog) add(req *WorkerRequest) *Error {
	rec, err := d.cfg.recordFor(req)
	if err == nil {
		err = rec.prepare(d.cfg)
	}
	if err != nil {
		return asError(err)
	}
	if d.ids[rec.WorkerID] {
		return errorf(KindUnprocessable, "declared more than once")
	}
	// Only the worker's own fields: the event mode's endpoints are left to
	// the catalog (see CheckWorkers).
	if reasons := rec.incompleteReasons(false); len(reasons) > 0 {
		return errorf(KindUnprocessable, "%s", reasons[0])
	}
	ranks, err := d.cfg.checkCapacity(len(d.ids), d.ranks, nil, &rec)
	if err != nil {
		return asError(err)
	}
	key := rec.Partition()
	if f := d.first[key]; f != nil {
		if err := partitionConflict(key, *f.BlockSize, f.eagle(), &rec); err != nil {
			return asError(err)
		}
	} else {
		d.first[key] = &rec
	}
	d.ids[rec.WorkerID] = true
	d.ranks = ranks
	return nil
}

// asError returns err as the *Error the catalog's checks return; any other
// error would be a bug, reported as internal.
func asError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Kind: KindInternal, Msg: err.Error()}
}
