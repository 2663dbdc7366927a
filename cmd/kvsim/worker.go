package main

import (
	"time"

	"github.com/kvrouter/caddy-kvrouter/indexer"
	"github.com/kvrouter/caddy-kvrouter/internal/engine"
	"github.com/kvrouter/caddy-kvrouter/selection"
)

// job is one request in flight: its prompt, the engine's state of it and
// what the policy booked for it.
type job struct {
	seq     engine.Seq
	id      uint64
	content *blocks // the prompt's full blocks are content.ids[:len(seq.Hashes)]
	sess    *session
	worker  *worker
	arrived time.Duration
	// firstToken is when the first output token came, -1 until then.
	firstToken time.Duration
	// estHits is the oracle's count of cached blocks at placement, for
	// its queue estimate of a waiting job.
	estHits int
	res     *selection.Reservation // the router's booking, for router policies
	moved   bool                   // a later turn placed away from its session's last worker
}

// State is the job's scheduler state (engine.Request).
func (j *job) State() *engine.Seq { return &j.seq }

// worker is one simulated engine: kvmock's scheduler and block pool
// (internal/engine) stepped in virtual time. Its KV events reach the index
// eventDelay after the step that made them, in order.
type worker struct {
	id    uint64
	rank  selection.Rank
	sim   *sim
	sched *engine.Scheduler[*job]

	busy bool // a step (or a run of decode steps) is scheduled
	// A run of identical decode steps in flight (engine.Scheduler.DecodeRun):
	// it started at runStart and lasts runSteps steps unless a new request
	// cuts it short; runGen tells a cut run's end event to do nothing.
	inRun    bool
	runStart time.Duration
	runSteps int
	runGen   uint64

	active int // jobs placed here and not finished
	// prefill counts the prompt tokens this worker computed in the measured
	// window; buckets, per time bucket.
	prefill int64
	buckets []int64
}

// submit hands j to the engine. A run of decode steps in flight ends at
// the step boundary after now, where the new request joins the batch, as
// it would had the steps been taken one by one.
func (w *worker) submit(j *job) {
	j.worker = w
	w.active++
	w.sched.Submit(j)
	if w.inRun {
		dt := w.sched.DecodeStep()
		done := int((w.sim.clock.now - w.runStart + dt - 1) / dt)
		if done < w.runSteps {
			w.runGen++
			w.inRun = false
			at := w.runStart + time.Duration(done)*dt
			w.sim.clock.at(at, func() {
				w.sched.Advance(done)
				w.step()
			})
		}
		return
	}
	if !w.busy {
		w.busy = true
		w.sim.clock.after(0, w.step)
	}
}

// step runs one scheduler step, or lets a run of identical decode steps
// pass at once.
func (w *worker) step() {
	c := &w.sim.clock
	if k := w.sched.DecodeRun(); k > 1 {
		w.inRun, w.runStart, w.runSteps = true, c.now, k-1
		gen := w.runGen
		c.after(time.Duration(k-1)*w.sched.DecodeStep(), func() {
			if gen != w.runGen {
				return // cut short by submit, which scheduled what follows
			}
			w.inRun = false
			w.sched.Advance(k - 1)
			w.step()
		})
		return
	}
	st := w.sched.Schedule(w.admitted)
	if len(st.Events) > 0 && w.sim.policy.usesIndex() {
		w.sim.publish(w, w.indexEvents(st.Events))
	}
	w.sim.countPrefill(w, st.Prefill)
	c.after(st.Duration, func() {
		w.sched.Complete(w.token)
		if w.sched.Idle() {
			w.busy = false
			return
		}
		w.step()
	})
}

// admitted records what the engine found cached for j.
func (w *worker) admitted(j *job) { w.sim.recordAdmission(j) }

// token hears of j's output tokens: the first ends its prefill, the last
// ends it.
func (w *worker) token(j *job, first, finished bool) {
	if first {
		j.firstToken = w.sim.clock.now
		w.sim.m.first(j, w.sim.clock.now)
		w.sim.policy.prefillDone(j)
	}
	if finished {
		w.active--
		w.sim.finished(j)
	}
}

// indexEvents turns the step's cache changes into the KV events the
// listener would apply: a removal of the evicted blocks, and a store per
// run of newly cached blocks with its tokens and parent.
func (w *worker) indexEvents(changes []engine.CacheEvent[*job]) []indexer.Event {
	bs := w.sched.Config.BlockSize
	out := make([]indexer.Event, 0, len(changes))
	for _, ch := range changes {
		if ch.Removed != nil {
			out = append(out, indexer.Event{Kind: indexer.Removed, BlockHashes: ch.Removed, Tier: indexer.Device})
			continue
		}
		j := ch.Req
		ev := indexer.Event{Kind: indexer.Stored, BlockSize: bs, Tier: indexer.Device,
			BlockHashes: append([]uint64(nil), j.seq.Hashes[ch.First:ch.Last]...),
			TokenIDs:    make([]uint32, 0, (ch.Last-ch.First)*bs)}
		for k := ch.First; k < ch.Last; k++ {
			ev.TokenIDs = w.sim.hasher.tokensOf(ev.TokenIDs, j.content.ids[k])
		}
		if ch.First > 0 {
			ev.ParentHash, ev.HasParent = j.seq.Hashes[ch.First-1], true
		}
		out = append(out, ev)
	}
	return out
}

// pendingPrefill is the prompt tokens the engine has yet to compute for
// the jobs it holds: what a new request waits behind. A waiting job counts
// its prompt less the blocks the oracle saw cached when it placed it.
func (w *worker) pendingPrefill() int {
	n := 0
	for _, j := range w.sched.Running {
		n += j.seq.PromptLen - j.seq.Computed
	}
	bs := w.sched.Config.BlockSize
	for _, j := range w.sched.Waiting {
		n += j.seq.PromptLen - j.estHits*bs
	}
	return n
}
