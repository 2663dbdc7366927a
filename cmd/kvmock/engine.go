package main

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/caddy-kvrouter/indexer"
	enginemodel "github.com/kvrouter/caddy-kvrouter/internal/engine"
)

// engine is one simulated engine core: one DP rank of a worker, with its
// own KV cache, scheduler goroutine and event publisher. The scheduler
// goroutine owns the pool and the waiting and running queues; everyone else
// talks to it through the inbox (under mu) and the wake channel.
type engine struct {
	cfg    *Config
	worker int // worker id, 1-based
	dpRank int
	sched  *enginemodel.Scheduler[*request]
	pub    *rankPub
	out    *publisher

	mu    sync.Mutex
	inbox []*request
	cmds  []engineCmd
	wake  chan struct{}
	done  chan struct{}

	stats engineStats
}

// engineStats are counters the scheduler writes and anyone may read.
type engineStats struct {
	served       atomic.Int64 // requests completed
	promptTokens atomic.Int64 // prompt tokens of admitted requests (prefix cache queries)
	cachedTokens atomic.Int64 // of which found in the cache (prefix cache hits)
	genTokens    atomic.Int64
	evictions    atomic.Int64
	running      atomic.Int64
	waiting      atomic.Int64
	usedBlocks   atomic.Int64
	cachedBlocks atomic.Int64
}

// cmdKind is an administrative action the scheduler performs between steps.
type cmdKind uint8

// The administrative actions.
const (
	// cmdReset drops the whole cache and announces AllBlocksCleared.
	cmdReset cmdKind = iota
	// cmdRestart behaves like a new process: requests fail, the cache is
	// empty, and the publisher starts again at sequence 0, silently.
	cmdRestart
	// cmdStop fails every request, closes the sockets and ends the goroutine.
	cmdStop
)

// engineCmd is an action with a channel closed once it is done.
type engineCmd struct {
	kind cmdKind
	done chan struct{}
}

// newEngine returns an engine whose scheduler is not running yet.
func newEngine(cfg *Config, worker, dpRank int, pub *rankPub) *engine {
	return &engine{
		cfg:    cfg,
		worker: worker,
		dpRank: dpRank,
		sched: enginemodel.NewScheduler[*request](enginemodel.Config{BlockSize: cfg.BlockSize, MaxBatchedTokens: cfg.MaxBatchedTokens,
			MaxNumSeqs: cfg.MaxNumSeqs, PrefillRate: cfg.PrefillRate, DecodeTime: cfg.DecodeTime}, cfg.KVBlocks),
		pub:  pub,
		wake: make(chan struct{}, 1),
		done: make(chan struct{}),
	}
}

// start runs the scheduler goroutine; out must be running.
func (e *engine) start(out *publisher) {
	e.out = out
	go e.run()
}

// submit queues a request for the next step.
func (e *engine) submit(r *request) {
	e.mu.Lock()
	e.inbox = append(e.inbox, r)
	e.mu.Unlock()
	e.stats.waiting.Add(1)
	e.poke()
}

// poke wakes the scheduler if it sleeps for want of work.
func (e *engine) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// do asks the scheduler for an action and waits until it is done, at most
// one step later. On a stopped engine it returns at once.
func (e *engine) do(kind cmdKind) {
	c := engineCmd{kind: kind, done: make(chan struct{})}
	e.mu.Lock()
	e.cmds = append(e.cmds, c)
	e.mu.Unlock()
	e.poke()
	select {
	case <-c.done:
	case <-e.done:
	}
}

// load is the number of requests the engine holds, for picking a DP rank.
func (e *engine) load() int64 { return e.stats.running.Load() + e.stats.waiting.Load() }

// run is the scheduler loop: take what arrived, run one step, repeat;
// sleep on the wake channel when there is nothing to do.
func (e *engine) run() {
	defer close(e.done)
	for {
		if !e.intake() {
			return
		}
		if e.sched.Idle() {
			<-e.wake
			continue
		}
		e.step()
	}
}

// intake moves new requests to the waiting queue, forgets aborted ones and
// performs queued commands. It reports false once the engine has stopped.
func (e *engine) intake() bool {
	e.mu.Lock()
	inbox, cmds := e.inbox, e.cmds
	e.inbox, e.cmds = nil, nil
	e.mu.Unlock()
	e.sched.Waiting = append(e.sched.Waiting, inbox...)
	e.sched.Waiting = slices.DeleteFunc(e.sched.Waiting, func(r *request) bool {
		if r.aborted.Load() {
			e.stats.waiting.Add(-1)
			return true
		}
		return false
	})
	e.sched.Running = slices.DeleteFunc(e.sched.Running, func(r *request) bool {
		if r.aborted.Load() {
			e.sched.Pool.Release(r.seq.Blocks)
			r.seq.Blocks = nil
			return true
		}
		return false
	})
	alive := true
	for _, c := range cmds {
		switch c.kind {
		case cmdReset:
			e.sched.Pool.Clear()
			e.publish([]any{indexer.Clear{}})
		case cmdRestart:
			e.failAll(errRestarted)
			e.sched.Pool.Reset()
			e.out.restart(e.pub)
		case cmdStop:
			e.failAll(errStopped)
			e.out.closeRank(e.pub)
			alive = false
		}
		close(c.done)
		if !alive {
			// Later commands return when the goroutine ends (see do).
			break
		}
	}
	if !alive {
		// Requests that slipped in after the stop find the engine gone.
		e.mu.Lock()
		e.sched.Waiting, e.inbox = e.inbox, nil
		e.mu.Unlock()
		e.failAll(errStopped)
	}
	e.updateGauges()
	return alive
}

// failAll ends every request the engine holds with err and gives their
// blocks back.
func (e *engine) failAll(err error) {
	for _, r := range e.sched.Running {
		e.sched.Pool.Release(r.seq.Blocks)
		r.seq.Blocks = nil
		r.fail(err)
	}
	for _, r := range e.sched.Waiting {
		r.fail(err)
	}
	e.stats.waiting.Add(-int64(len(e.sched.Waiting)))
	e.sched.Running, e.sched.Waiting = nil, nil
}

// step runs one scheduler step (enginemodel.Scheduler: running requests first,
// then waiting ones in FIFO order while the token budget, the sequence
// limit and the free blocks allow). The events of the blocks the step
// caches and evicts go out before the step "computes", because vLLM also
// publishes at schedule time. Then the goroutine sleeps for the simulated
// compute time and hands out the tokens the step produced.
func (e *engine) step() {
	st := e.sched.Schedule(e.admitted)
	if len(st.Events) > 0 {
		e.publish(e.cacheEvents(st.Events))
	}
	e.updateGauges()

	time.Sleep(st.Duration)

	now := time.Now()
	e.sched.Complete(func(r *request, first, finished bool) {
		e.stats.genTokens.Add(1)
		generated := r.seq.Generated
		r.update(func(p *progress) {
			p.generated = generated
			if first {
				p.firstToken = now
			}
			p.done = finished
		})
		if finished {
			e.stats.served.Add(1)
		}
	})
	e.updateGauges()
}

// admitted counts a request the scheduler admitted and tells its handler.
func (e *engine) admitted(r *request) {
	e.stats.promptTokens.Add(int64(len(r.prompt)))
	e.stats.cachedTokens.Add(int64(r.seq.HitTokens))
	e.stats.waiting.Add(-1)
	hit := r.seq.HitTokens
	r.update(func(p *progress) { p.admitted, p.cachedTokens = true, hit })
}

// cacheEvents turns the scheduler's cache changes into KV events: a
// BlockRemoved per evicted block, and a BlockStored per run of newly
// cached blocks, with the parent hash of the block before the run.
func (e *engine) cacheEvents(changes []enginemodel.CacheEvent[*request]) []any {
	bs := e.cfg.BlockSize
	events := make([]any, 0, len(changes))
	for _, c := range changes {
		for _, h := range c.Removed {
			events = append(events, indexer.Removal{BlockHashes: []uint64{h}, Medium: "GPU"})
		}
		if c.Removed != nil {
			continue
		}
		r := c.Req
		ev := &indexer.StoredBlocks{BlockSize: bs, Medium: "GPU", LoraName: r.lora, CacheSalt: r.salt,
			BlockHashes: append([]uint64(nil), r.seq.Hashes[c.First:c.Last]...),
			TokenIDs:    append([]uint32(nil), r.prompt[c.First*bs:c.Last*bs]...)}
		if c.First > 0 {
			parent := r.seq.Hashes[c.First-1]
			ev.Parent = &parent
		}
		events = append(events, ev)
	}
	return events
}

// perGroup repeats events once per KV-cache group, as vLLM's hybrid cache
// manager publishes them: each group's copy tagged with its group_idx,
// a store's also with its group's kind.
func (e *engine) perGroup(events []any) []any {
	kinds := e.cfg.KVCacheGroups
	if len(kinds) == 0 {
		return events
	}
	out := make([]any, 0, len(events)*len(kinds))
	for _, ev := range events {
		switch v := ev.(type) {
		case *indexer.StoredBlocks:
			for g, kind := range kinds {
				c := *v
				c.Group, c.SpecKind = g, kind
				out = append(out, &c)
			}
		case indexer.Removal:
			for g := range kinds {
				v.Group, v.Grouped = g, true
				out = append(out, v)
			}
		default: // AllBlocksCleared: once, for every group
			out = append(out, ev)
		}
	}
	return out
}

// publish encodes one batch and hands it to the sender.
func (e *engine) publish(events []any) {
	for _, ev := range events {
		if _, ok := ev.(indexer.Removal); ok {
			e.stats.evictions.Add(1)
		}
	}
	events = e.perGroup(events)
	ts := float64(time.Now().UnixNano()) / 1e9
	payload := indexer.AppendBatch(nil, e.cfg.Encoding, ts, e.dpRank, events...)
	e.out.publish(e.pub, payload, len(events))
}

// updateGauges refreshes the gauges others read.
func (e *engine) updateGauges() {
	e.stats.running.Store(int64(len(e.sched.Running)))
	e.stats.usedBlocks.Store(int64(e.sched.Pool.Size() - e.sched.Pool.NumFree()))
	e.stats.cachedBlocks.Store(int64(e.sched.Pool.NumCached()))
}

// usage is the fraction of the KV cache held by running requests, which is
// what vLLM reports as kv_cache_usage_perc (cached free blocks count as
// free, since they can be evicted at any time).
func (e *engine) usage() float64 {
	u := float64(e.stats.usedBlocks.Load()) / float64(e.cfg.KVBlocks)
	return math.Round(u*1e6) / 1e6
}
