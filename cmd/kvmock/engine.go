package main

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/caddy-kvrouter/indexer"
)

// engine is one simulated engine core: one DP rank of a worker, with its
// own KV cache, scheduler goroutine and event publisher. The scheduler
// goroutine owns the pool and the waiting and running queues; everyone else
// talks to it through the inbox (under mu) and the wake channel.
type engine struct {
	cfg    *Config
	worker int // worker id, 1-based
	dpRank int
	pool   *blockPool
	pub    *rankPub
	out    *publisher

	mu    sync.Mutex
	inbox []*request
	cmds  []engineCmd
	wake  chan struct{}
	done  chan struct{}

	// Scheduler-owned queues.
	waiting []*request
	running []*request

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
		pool:   newBlockPool(cfg.KVBlocks),
		pub:    pub,
		wake:   make(chan struct{}, 1),
		done:   make(chan struct{}),
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
		if len(e.waiting) == 0 && len(e.running) == 0 {
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
	e.waiting = append(e.waiting, inbox...)
	e.waiting = slices.DeleteFunc(e.waiting, func(r *request) bool {
		if r.aborted.Load() {
			e.stats.waiting.Add(-1)
			return true
		}
		return false
	})
	e.running = slices.DeleteFunc(e.running, func(r *request) bool {
		if r.aborted.Load() {
			e.pool.release(r.blocks)
			r.blocks = nil
			return true
		}
		return false
	})
	alive := true
	for _, c := range cmds {
		switch c.kind {
		case cmdReset:
			e.pool.clear()
			e.publish([]any{indexer.Clear{}})
		case cmdRestart:
			e.failAll(errRestarted)
			e.pool.reset()
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
		e.waiting, e.inbox = e.inbox, nil
		e.mu.Unlock()
		e.failAll(errStopped)
	}
	e.updateGauges()
	return alive
}

// failAll ends every request the engine holds with err and gives their
// blocks back.
func (e *engine) failAll(err error) {
	for _, r := range e.running {
		e.pool.release(r.blocks)
		r.blocks = nil
		r.fail(err)
	}
	for _, r := range e.waiting {
		r.fail(err)
	}
	e.stats.waiting.Add(-int64(len(e.waiting)))
	e.running, e.waiting = nil, nil
}

// step runs one scheduler step, as vLLM's V1 scheduler does: running
// requests first (one decode token each, or the next chunk of their
// prompt), then waiting ones in FIFO order while the token budget, the
// sequence limit and the free blocks allow. Blocks that the scheduled
// tokens fill are cached right away, and their events go out before the
// step "computes", because vLLM also publishes at schedule time. Then the
// goroutine sleeps for the simulated compute time and hands out the tokens
// the step produced.
func (e *engine) step() {
	budget := e.cfg.MaxBatchedTokens
	prefill, sampling := 0, 0
	var events []any
	schedule := func(r *request) {
		if !r.inPrefill() {
			r.scheduled = 1
			budget--
			sampling++
			return
		}
		n := min(len(r.prompt)-r.computed, budget)
		r.scheduled = n
		budget -= n
		prefill += n
		if r.computed+n == len(r.prompt) {
			sampling++ // the step that finishes a prompt samples its first token
		}
		events = e.cacheBlocks(r, r.computed+n, events)
	}
	for _, r := range e.running {
		if budget == 0 {
			break
		}
		schedule(r)
	}
	for len(e.waiting) > 0 && budget > 0 && len(e.running) < e.cfg.MaxNumSeqs {
		r := e.waiting[0]
		if !e.admit(r) {
			break // FIFO: nobody overtakes the head of the queue
		}
		for _, h := range e.pool.takeEvicted() {
			events = append(events, indexer.Removal{BlockHashes: []uint64{h}, Medium: "GPU"})
		}
		e.waiting = e.waiting[1:]
		e.running = append(e.running, r)
		schedule(r)
	}
	if len(events) > 0 {
		e.publish(events)
	}
	e.updateGauges()

	d := time.Duration(float64(prefill) / e.cfg.PrefillRate * float64(time.Second))
	if sampling > 0 {
		d += e.cfg.DecodeTime
	}
	// A floor keeps a step of nothing but zero-cost work from spinning.
	time.Sleep(max(d, time.Millisecond))

	now := time.Now()
	e.running = slices.DeleteFunc(e.running, func(r *request) bool {
		n := r.scheduled
		if n == 0 {
			return false
		}
		r.scheduled = 0
		if r.inPrefill() {
			r.computed += n
			if r.inPrefill() {
				return false
			}
		}
		r.generated++
		e.stats.genTokens.Add(1)
		finished := r.generated >= r.maxTokens
		r.update(func(p *progress) {
			p.generated = r.generated
			if r.generated == 1 {
				p.firstToken = now
			}
			p.done = finished
		})
		if finished {
			e.pool.release(r.blocks)
			r.blocks = nil
			e.stats.served.Add(1)
		}
		return finished
	})
	e.updateGauges()
}

// admit gives the head of the waiting queue its blocks: the cached prefix
// first, then fresh blocks for the rest of the prompt and all its output
// tokens. Allocating the output blocks up front means a running request
// never needs preempting. It reports false when the free blocks do not
// suffice yet.
func (e *engine) admit(r *request) bool {
	bs := e.cfg.BlockSize
	// As in vLLM, at least one prompt token is always computed, so a prompt
	// cached in full still hits only up to its second-to-last token.
	hits, freeHits := e.pool.match(r.hashes, (len(r.prompt)-1)/bs)
	fresh := r.needBlocks - hits
	if e.pool.numFree()-freeHits < fresh {
		return false
	}
	r.blocks = e.pool.take(r.hashes, hits, make([]int32, 0, r.needBlocks))
	r.blocks = e.pool.allocate(fresh, r.blocks)
	r.hitTokens = hits * bs
	r.computed = r.hitTokens
	r.handled = hits
	e.stats.promptTokens.Add(int64(len(r.prompt)))
	e.stats.cachedTokens.Add(int64(r.hitTokens))
	e.stats.waiting.Add(-1)
	r.update(func(p *progress) { p.admitted, p.cachedTokens = true, r.hitTokens })
	return true
}

// cacheBlocks caches the prompt blocks that are full once the first upTo
// prompt tokens are computed, and appends their BlockStored events: one per
// unbroken run of newly cached blocks, with the parent hash of the block
// before the run. Output tokens are never cached: only prompt blocks are,
// which is all a router needs to follow prefixes (vLLM caches generated
// blocks too, but they are rarely the prefix of another request).
func (e *engine) cacheBlocks(r *request, upTo int, events []any) []any {
	bs := e.cfg.BlockSize
	full := upTo / bs
	var cur *indexer.StoredBlocks
	for ; r.handled < full; r.handled++ {
		k := r.handled
		if !e.pool.register(r.blocks[k], r.hashes[k]) {
			cur = nil // someone else holds this hash; the run breaks here
			continue
		}
		if cur == nil {
			cur = &indexer.StoredBlocks{BlockSize: bs, Medium: "GPU", LoraName: r.lora}
			if k > 0 {
				parent := r.hashes[k-1]
				cur.Parent = &parent
			}
			events = append(events, cur)
		}
		cur.BlockHashes = append(cur.BlockHashes, r.hashes[k])
		cur.TokenIDs = append(cur.TokenIDs, r.prompt[k*bs:(k+1)*bs]...)
	}
	return events
}

// publish encodes one batch and hands it to the sender.
func (e *engine) publish(events []any) {
	for _, ev := range events {
		if _, ok := ev.(indexer.Removal); ok {
			e.stats.evictions.Add(1)
		}
	}
	ts := float64(time.Now().UnixNano()) / 1e9
	payload := indexer.AppendBatch(nil, e.cfg.Encoding, ts, e.dpRank, events...)
	e.out.publish(e.pub, payload, len(events))
}

// updateGauges refreshes the gauges others read.
func (e *engine) updateGauges() {
	e.stats.running.Store(int64(len(e.running)))
	e.stats.usedBlocks.Store(int64(e.pool.size() - e.pool.numFree()))
	e.stats.cachedBlocks.Store(int64(e.pool.numCached()))
}

// usage is the fraction of the KV cache held by running requests, which is
// what vLLM reports as kv_cache_usage_perc (cached free blocks count as
// free, since they can be evicted at any time).
func (e *engine) usage() float64 {
	u := float64(e.stats.usedBlocks.Load()) / float64(e.cfg.KVBlocks)
	return math.Round(u*1e6) / 1e6
}
