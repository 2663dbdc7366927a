package engine

import (
	"slices"
	"time"
)

// Config is the scheduler's shape and speed.
type Config struct {
	// BlockSize is the number of tokens per KV block.
	BlockSize int
	// MaxBatchedTokens is the token budget of one step.
	MaxBatchedTokens int
	// MaxNumSeqs bounds the sequences running at once.
	MaxNumSeqs int
	// PrefillRate is how many uncached prompt tokens are computed per second.
	PrefillRate float64
	// DecodeTime is the extra duration of a step that samples output tokens.
	DecodeTime time.Duration
}

// MinStep is the shortest step: it keeps a step of nothing but zero-cost
// work from spinning.
const MinStep = time.Millisecond

// Seq is the scheduler's state of one request. The caller fills the
// request's shape (NewSeq); the scheduler owns the rest.
type Seq struct {
	// PromptLen is the prompt's length in tokens.
	PromptLen int
	// Hashes are the chained hashes of the prompt's full blocks.
	Hashes []uint64
	// MaxTokens is the number of output tokens the request generates.
	MaxTokens int
	// NeedBlocks is the blocks the request holds while it runs: its prompt
	// and every output token.
	NeedBlocks int

	// Blocks are the request's KV blocks, prompt blocks first.
	Blocks []int32
	// SkipCacheRead keeps the request from reading the cache (vLLM's
	// skip_reading_prefix_cache); its blocks are still cached.
	SkipCacheRead bool
	// HitTokens are the prompt tokens found in the cache at admission.
	HitTokens int
	// Computed counts the prompt tokens whose KV exists (hits included).
	Computed int
	// Handled counts the prompt blocks already considered for caching.
	Handled int
	// Scheduled is the tokens scheduled in the current step.
	Scheduled int
	// Generated counts the output tokens produced so far.
	Generated int
}

// NewSeq returns the state of a request of promptLen tokens whose full
// blocks hash to hashes and which generates maxTokens tokens.
func NewSeq(promptLen int, hashes []uint64, maxTokens, blockSize int) Seq {
	return Seq{PromptLen: promptLen, Hashes: hashes, MaxTokens: maxTokens,
		NeedBlocks: (promptLen + maxTokens + blockSize - 1) / blockSize}
}

// InPrefill reports whether prompt tokens remain to be computed.
func (s *Seq) InPrefill() bool { return s.Computed < s.PromptLen }

// Request is what a scheduler schedules: the caller's own request type,
// which carries a Seq.
type Request interface {
	comparable
	State() *Seq
}

// Scheduler is one engine core's vLLM V1-like scheduler over its block
// pool. It has no lock: its owner (a goroutine in kvmock, the event loop
// in kvsim) calls it from one place.
type Scheduler[R Request] struct {
	Config Config
	Pool   *BlockPool
	// Waiting is the FIFO queue of requests not yet admitted; Running, the
	// admitted ones. Callers append to Waiting (Submit) and may drop from
	// either between steps (aborts), releasing the blocks of a running one.
	Waiting []R
	Running []R
}

// NewScheduler returns an idle scheduler with an empty pool of kvBlocks.
func NewScheduler[R Request](cfg Config, kvBlocks int) *Scheduler[R] {
	return &Scheduler[R]{Config: cfg, Pool: NewBlockPool(kvBlocks)}
}

// Submit queues a request for the next step.
func (s *Scheduler[R]) Submit(r R) { s.Waiting = append(s.Waiting, r) }

// Idle reports whether the scheduler holds no request.
func (s *Scheduler[R]) Idle() bool { return len(s.Waiting) == 0 && len(s.Running) == 0 }

// CacheEvent is one change to the cache a step made, in the order made:
// either Removed (hashes evicted, one event each in vLLM's stream) or a run
// of newly cached blocks of Req, blocks [First, Last) of its prompt.
type CacheEvent[R Request] struct {
	Removed     []uint64
	Req         R
	First, Last int
}

// Step is what Schedule planned: how long the step computes, and the cache
// events to publish now (vLLM publishes at schedule time, before the step
// computes).
type Step[R Request] struct {
	Duration time.Duration
	Events   []CacheEvent[R]
	// Prefill counts the prompt tokens the step computes.
	Prefill int
}

// Schedule plans one step, as vLLM's V1 scheduler does: running requests
// first (one decode token each, or the next chunk of their prompt), then
// waiting ones in FIFO order while the token budget, the sequence limit
// and the free blocks allow. Blocks that the scheduled tokens fill are
// cached right away. admitted, when not nil, hears of each admission as it
// happens. The caller lets Duration pass, then calls Complete.
func (s *Scheduler[R]) Schedule(admitted func(R)) Step[R] {
	budget := s.Config.MaxBatchedTokens
	prefill, sampling := 0, 0
	var events []CacheEvent[R]
	schedule := func(r R) {
		q := r.State()
		if !q.InPrefill() {
			q.Scheduled = 1
			budget--
			sampling++
			return
		}
		n := min(q.PromptLen-q.Computed, budget)
		q.Scheduled = n
		budget -= n
		prefill += n
		if q.Computed+n == q.PromptLen {
			sampling++ // the step that finishes a prompt samples its first token
		}
		events = s.cacheBlocks(r, q.Computed+n, events)
	}
	for _, r := range s.Running {
		if budget == 0 {
			break
		}
		schedule(r)
	}
	for len(s.Waiting) > 0 && budget > 0 && len(s.Running) < s.Config.MaxNumSeqs {
		r := s.Waiting[0]
		if !s.admit(r) {
			break // FIFO: nobody overtakes the head of the queue
		}
		if admitted != nil {
			admitted(r)
		}
		if ev := s.Pool.TakeEvicted(); len(ev) > 0 {
			events = append(events, CacheEvent[R]{Removed: ev})
		}
		s.Waiting = s.Waiting[1:]
		s.Running = append(s.Running, r)
		schedule(r)
	}
	d := time.Duration(float64(prefill) / s.Config.PrefillRate * float64(time.Second))
	if sampling > 0 {
		d += s.Config.DecodeTime
	}
	return Step[R]{Duration: max(d, MinStep), Events: events, Prefill: prefill}
}

// Complete ends the step Schedule planned: prompt chunks become computed,
// and each request that sampled a token hears of it through token (first
// is its first token, finished its last). A finished request leaves the
// running queue and gives its blocks back.
func (s *Scheduler[R]) Complete(token func(r R, first, finished bool)) {
	s.Running = slices.DeleteFunc(s.Running, func(r R) bool {
		q := r.State()
		n := q.Scheduled
		if n == 0 {
			return false
		}
		q.Scheduled = 0
		if q.InPrefill() {
			q.Computed += n
			if q.InPrefill() {
				return false
			}
		}
		q.Generated++
		finished := q.Generated >= q.MaxTokens
		token(r, q.Generated == 1, finished)
		if finished {
			s.Pool.Release(q.Blocks)
			q.Blocks = nil
		}
		return finished
	})
}

// admit gives the head of the waiting queue its blocks: the cached prefix
// first, then fresh blocks for the rest of the prompt and all its output
// tokens. Allocating the output blocks up front means a running request
// never needs preempting. It reports false when the free blocks do not
// suffice yet.
func (s *Scheduler[R]) admit(r R) bool {
	q := r.State()
	bs := s.Config.BlockSize
	// As in vLLM, at least one prompt token is always computed, so a prompt
	// cached in full still hits only up to its second-to-last token.
	limit := (q.PromptLen - 1) / bs
	if q.SkipCacheRead {
		limit = 0
	}
	hits, freeHits := s.Pool.Match(q.Hashes, limit)
	fresh := q.NeedBlocks - hits
	if s.Pool.NumFree()-freeHits < fresh {
		return false
	}
	q.Blocks = s.Pool.Take(q.Hashes, hits, make([]int32, 0, q.NeedBlocks))
	q.Blocks = s.Pool.Allocate(fresh, q.Blocks)
	q.HitTokens = hits * bs
	q.Computed = q.HitTokens
	q.Handled = hits
	return true
}

// cacheBlocks caches the prompt blocks that are full once the first upTo
// prompt tokens are computed, and appends one event per unbroken run of
// newly cached blocks. Output tokens are never cached: only prompt blocks
// are, which is all a router needs to follow prefixes (vLLM caches
// generated blocks too, but they are rarely the prefix of another request).
func (s *Scheduler[R]) cacheBlocks(r R, upTo int, events []CacheEvent[R]) []CacheEvent[R] {
	q := r.State()
	full := upTo / s.Config.BlockSize
	run := -1 // index in events of the open run
	for ; q.Handled < full; q.Handled++ {
		k := q.Handled
		if !s.Pool.Register(q.Blocks[k], q.Hashes[k]) {
			run = -1 // someone else holds this hash; the run breaks here
			continue
		}
		if run < 0 {
			events = append(events, CacheEvent[R]{Req: r, First: k, Last: k})
			run = len(events) - 1
		}
		events[run].Last = k + 1
	}
	return events
}

// DecodeRun reports how many coming steps are identical pure-decode steps:
// every running request is past its prompt, the budget and sequence
// limit leave nothing for the waiting queue or the head of the queue
// cannot be admitted, so each step samples one token per running request
// and changes nothing else. It is the number of steps until the first
// running request finishes, 0 when the next step is not of that kind. A
// virtual-time caller may let that many steps pass at once (Advance)
// instead of one by one; the outcome is the same.
func (s *Scheduler[R]) DecodeRun() int {
	if len(s.Running) == 0 || len(s.Running) > s.Config.MaxBatchedTokens {
		return 0
	}
	n := -1
	for _, r := range s.Running {
		q := r.State()
		if q.InPrefill() {
			return 0
		}
		if left := q.MaxTokens - q.Generated; n < 0 || left < n {
			n = left
		}
	}
	if len(s.Waiting) > 0 && len(s.Running) < s.Config.MaxNumSeqs && len(s.Running) < s.Config.MaxBatchedTokens {
		if s.admissible(s.Waiting[0]) {
			return 0
		}
	}
	return max(n, 0)
}

// admissible reports whether admit would take r now, changing nothing.
func (s *Scheduler[R]) admissible(r R) bool {
	q := r.State()
	hits, freeHits := s.Pool.Match(q.Hashes, (q.PromptLen-1)/s.Config.BlockSize)
	return s.Pool.NumFree()-freeHits >= q.NeedBlocks-hits
}

// Advance lets n pure-decode steps pass at once, n below DecodeRun's
// answer so that none of them finishes a request: each running request
// gains n tokens, none of them a first or a last one. The step after them
// is an ordinary one (Schedule, Complete).
func (s *Scheduler[R]) Advance(n int) {
	for _, r := range s.Running {
		r.State().Generated += n
	}
}

// DecodeStep is the duration of a pure-decode step.
func (s *Scheduler[R]) DecodeStep() time.Duration { return max(s.Config.DecodeTime, MinStep) }
