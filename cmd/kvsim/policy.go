package main

import (
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// policy places requests on workers and hears of their lifecycle, as the
// gateway's handler tells the router: placed on arrival, prefill done at
// the first token, released at the end.
type policy interface {
	// place picks j's worker.
	place(j *job) (*worker, error)
	// prefillDone is j's first output token.
	prefillDone(j *job)
	// release is j's end.
	release(j *job)
	// usesIndex reports whether the policy reads the KV-event index, so the
	// simulation applies the engines' events to it.
	usesIndex() bool
	close()
}

// routerPolicy is the real selection.Router, fed by the real
// indexer.Index, booked through Reserve as caddymodule's handler books it.
type routerPolicy struct {
	s      *sim
	r      *selection.Router
	byID   map[uint64]*worker
	noHash []uint64
}

func newRouterPolicy(s *sim, cfg selection.Config) (*routerPolicy, error) {
	// The gateway's settings that the simulation needs: events come from
	// the engines (here: applied to the index directly, so no endpoint is
	// needed, as with kv_events_bind), health is not simulated, and the
	// picker draws from the run's seed.
	cfg.UseKVEvents, cfg.KVEventsBound = true, true
	cfg.WorkerDownAfter = 0
	cfg.DefaultBlockSize = uint32(s.cfg.BlockSize)
	src := rand.New(rand.NewPCG(s.cfg.Seed, 0x726f75746572))
	cfg.Rand = src.Float64
	r, err := selection.NewRouter(cfg, selection.WithIndexer(s.index), selection.WithClock(s.wallClock))
	if err != nil {
		return nil, err
	}
	p := &routerPolicy{s: s, r: r, byID: make(map[uint64]*worker), noHash: []uint64{}}
	model := s.part.Model
	bs := uint32(s.cfg.BlockSize)
	kv := uint64(s.cfg.KVBlocks)
	batched := uint64(s.cfg.MaxBatchedTokens)
	for _, w := range s.workers {
		id := w.id
		ep := "127.0.0.1:" + strconv.FormatUint(10000+id, 10) // never dialled
		if _, err := r.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: &id, ModelName: &model, Endpoint: &ep,
			BlockSize: &bs, TotalKVBlocks: &kv, MaxNumBatchedTokens: &batched}); err != nil {
			r.Close()
			return nil, fmt.Errorf("registering worker %d: %w", id, err)
		}
		p.byID[id] = w
	}
	return p, nil
}

func (p *routerPolicy) place(j *job) (*worker, error) {
	n := len(j.seq.Hashes)
	isl := uint64(j.seq.PromptLen)
	req := &selection.SelectRequest{
		Partition:   selection.Partition{ModelName: p.s.part.Model},
		Prompt:      selection.Prompt{BlockHashes: j.content.local[:n:n], SequenceHashes: j.content.chain[:n:n], ISLTokens: &isl},
		SelectionID: "j" + strconv.FormatUint(j.id, 10),
		Lean:        true,
	}
	if n == 0 {
		req.BlockHashes, req.SequenceHashes = p.noHash, p.noHash
	}
	res, err := p.r.Reserve(req, false)
	if err != nil {
		return nil, err
	}
	j.res = res
	w := p.byID[res.Response().WorkerID]
	if w == nil {
		res.Release()
		return nil, fmt.Errorf("router chose unknown worker %d", res.Response().WorkerID)
	}
	return w, nil
}

func (p *routerPolicy) prefillDone(j *job) {
	j.res.Answered(200)
	j.res.PrefillDone()
}

func (p *routerPolicy) release(j *job) {
	j.res.Release()
	j.res = nil
}

func (p *routerPolicy) usesIndex() bool { return true }
func (p *routerPolicy) close()          { p.r.Close() }

// noop is the lifecycle of policies that keep no bookings.
type noop struct{}

func (noop) prefillDone(*job) {}
func (noop) release(*job)     {}
func (noop) usesIndex() bool  { return false }
func (noop) close()           {}

// roundRobin places requests on the workers in turn.
type roundRobin struct {
	noop
	s    *sim
	next int
}

func (p *roundRobin) place(*job) (*worker, error) {
	w := p.s.workers[p.next%len(p.s.workers)]
	p.next++
	return w, nil
}

// randomPolicy places each request on a worker drawn from the seed.
type randomPolicy struct {
	noop
	s   *sim
	rng *rand.Rand
}

func (p *randomPolicy) place(*job) (*worker, error) {
	return p.s.workers[p.rng.IntN(len(p.s.workers))], nil
}

// leastLoaded places each request on the worker with the fewest requests
// in flight; ties go to the first after the last pick, so equal workers
// take turns.
type leastLoaded struct {
	noop
	s    *sim
	next int
}

func (p *leastLoaded) place(*job) (*worker, error) {
	ws := p.s.workers
	var best *worker
	for i := range ws {
		w := ws[(p.next+i)%len(ws)]
		if best == nil || w.active < best.active {
			best = w
		}
	}
	p.next++
	return best, nil
}

// oracle knows every engine's true cache and queue, which no router does:
// it places each request where its estimated time to first token is
// least, that is where (prompt tokens still to compute for the requests
// queued and running there + the tokens of this prompt not cached there)
// is least, the cache read from the engine's block pool itself. Ties go
// to the worker with the fewest requests in flight, then in turn. It is
// the ceiling under the fleet's real constraints (capacity, queueing),
// not an unbounded cache: it may give up a hit to avoid a long queue.
type oracle struct {
	noop
	s    *sim
	next int
}

func (p *oracle) place(j *job) (*worker, error) {
	ws := p.s.workers
	bs := p.s.cfg.BlockSize
	limit := (j.seq.PromptLen - 1) / bs
	var best *worker
	bestCost, bestHits := 0, 0
	consider := func(w *worker) {
		pending := w.pendingPrefill()
		if best != nil && pending+j.seq.PromptLen-limit*bs > bestCost {
			return // even a full hit would not make it the best: skip the cache lookup
		}
		hits, _ := w.sched.Pool.Match(j.seq.Hashes, limit)
		cost := pending + j.seq.PromptLen - hits*bs
		if best == nil || cost < bestCost || cost == bestCost && w.active < best.active {
			best, bestCost, bestHits = w, cost, hits
		}
	}
	// The session's last worker first: it usually holds its context, and
	// its cost bounds the rest, most of which then need no cache lookup.
	var home *worker
	if j.sess != nil {
		home = j.sess.last
	}
	if home != nil {
		consider(home)
	}
	for i := range ws {
		if w := ws[(p.next+i)%len(ws)]; w != home {
			consider(w)
		}
	}
	p.next++
	j.estHits = bestHits
	return best, nil
}

// firstBlock places every request by its prompt's first block alone, blind
// to load: all the requests that share a first block (a conversation, a
// family of prompts with one system prompt) go to one worker. On a trace
// it keeps every reuse it can, as one cache as large as the fleet's
// would, as long as no worker's queue evicts a prefix before its next
// request is admitted; it is the reference that shows what load costs the
// hit ratio (docs/routing.md). With a system prompt shared by every
// session it sends them all to one worker, so it is for traces.
type firstBlock struct {
	noop
	s *sim
}

func (p *firstBlock) place(j *job) (*worker, error) {
	ws := p.s.workers
	if len(j.seq.Hashes) == 0 { // a prompt shorter than one block
		return ws[0], nil
	}
	// The engine hash is already well mixed; the multiply spreads it
	// over the workers whatever their count.
	h := j.seq.Hashes[0] * 0x9E3779B97F4A7C15
	return ws[(h>>32)%uint64(len(ws))], nil
}
