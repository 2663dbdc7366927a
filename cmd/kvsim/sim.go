package main

import (
	"fmt"
	"time"

	"github.com/kvrouter/caddy-kvrouter/indexer"
	"github.com/kvrouter/caddy-kvrouter/internal/engine"
	"github.com/kvrouter/caddy-kvrouter/selection"
)

// epoch is the wall-clock instant virtual time 0 stands for, given to the
// router as its clock: fixed, so that a run does not depend on the day.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// sim is one policy's run: the fleet, the index, the workload and the
// measurements, in virtual time.
type sim struct {
	cfg     *config
	clock   clock
	workers []*worker
	index   *indexer.Index
	part    selection.PartitionKey
	policy  policy
	hasher  *hasher
	m       *metrics
	nextJob uint64
	// applyErrors counts events the index refused (unknown parents after
	// an eviction raced a store, for instance), as the listener counts them.
	applyErrors int64
	refused     int64 // requests no worker could ever hold, or the policy refused
}

// newSim builds the fleet and an empty index for one run.
func newSim(cfg *config, h *hasher) *sim {
	s := &sim{cfg: cfg, index: indexer.New(), part: (&selection.Partition{ModelName: "sim"}).Key(), hasher: h}
	s.index.MaxEntries = indexer.EntriesForMemory(cfg.IndexMaxMemory)
	s.index.ConfigurePartition(s.part, cfg.BlockSize, false)
	ecfg := engine.Config{BlockSize: cfg.BlockSize, MaxBatchedTokens: cfg.MaxBatchedTokens, MaxNumSeqs: cfg.MaxNumSeqs,
		PrefillRate: cfg.PrefillRate, DecodeTime: cfg.DecodeTime}
	s.m = newMetrics(cfg)
	for i := range cfg.Workers {
		id := uint64(i + 1)
		s.workers = append(s.workers, &worker{id: id, rank: selection.Rank{WorkerID: id}, sim: s,
			sched: engine.NewScheduler[*job](ecfg, cfg.KVBlocks), buckets: make([]int64, s.m.nBuckets)})
	}
	return s
}

// wallClock is the router's clock: virtual time from a fixed epoch.
func (s *sim) wallClock() time.Time { return epoch.Add(s.clock.now) }

// publish delivers a worker's events to the index after the event delay,
// in order (equal delays keep the clock's order). Only policies that read
// the index get them (worker.step).
func (s *sim) publish(w *worker, evs []indexer.Event) {
	s.clock.after(s.cfg.EventDelay, func() {
		for i := range evs {
			if err := s.index.Apply(s.part, w.rank, &evs[i]); err != nil {
				s.applyErrors++
			}
		}
	})
}

// newJob is a request of isl tokens whose full blocks are the first ones
// of content, generating out tokens.
func (s *sim) newJob(content *blocks, isl, out int, sess *session) *job {
	s.nextJob++
	n := isl / s.cfg.BlockSize
	return &job{id: s.nextJob, content: content, sess: sess, arrived: s.clock.now, firstToken: -1,
		seq: engine.NewSeq(isl, content.chain[:n:n], out, s.cfg.BlockSize)}
}

// dispatch places j and hands it to its worker. It reports false when j
// was refused (never fits a worker, or the policy found no worker).
func (s *sim) dispatch(j *job) bool {
	if j.seq.NeedBlocks > s.cfg.KVBlocks {
		s.refused++
		return false
	}
	w, err := s.policy.place(j)
	if err != nil {
		s.refused++
		return false
	}
	if j.sess != nil && j.sess.last != nil && j.sess.last != w {
		j.moved = true
	}
	s.m.arrival(j, s.clock.now)
	w.submit(j)
	return true
}

// recordAdmission counts what the engine found cached for j.
func (s *sim) recordAdmission(j *job) { s.m.admission(j, s.clock.now) }

// countPrefill counts the prompt tokens a worker's step computes.
func (s *sim) countPrefill(w *worker, n int) {
	if n == 0 {
		return
	}
	if b, ok := s.m.bucket(s.clock.now); ok {
		w.prefill += int64(n)
		w.buckets[b] += int64(n)
	}
}

// finished ends j: the policy releases it, the metrics record it and its
// session goes on.
func (s *sim) finished(j *job) {
	s.policy.release(j)
	if j.sess != nil {
		j.sess.last = j.worker
		j.sess.turnDone(s, j)
	}
	j.content, j.seq.Hashes = nil, nil
}

// run plays the workload through the policy and returns its result.
func (s *sim) run(wl workload) (*result, error) {
	if err := wl.start(s); err != nil {
		return nil, err
	}
	s.clock.run(s.cfg.end())
	s.policy.close()
	r := s.m.result(s)
	r.ApplyErrors, r.Refused = s.applyErrors, s.refused
	if r.Requests == 0 {
		return r, fmt.Errorf("no request arrived in the measured window")
	}
	return r, nil
}
