package main

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Errors a request can end with before it completes.
var (
	// errRestarted ends the requests of a worker that restarts: its old
	// process is gone, and so are their connections.
	errRestarted = errors.New("worker restarted")
	// errStopped ends the requests of a worker that stops.
	errStopped = errors.New("worker stopped")
)

// request is one completion as the scheduler sees it. The HTTP handler
// creates it, the scheduler goroutine advances it, and the two meet only in
// progress (under mu) and the wake channel, so the scheduler never blocks on
// a slow client and no goroutine or timer exists per token.
type request struct {
	prompt    []uint32
	hashes    []uint64 // chained hashes of the prompt's full blocks
	lora      string   // the LoRA adapter serving it, "" for the base model
	maxTokens int
	arrived   time.Time

	// Scheduler-owned fields.
	blocks     []int32 // KV blocks, prompt blocks first
	needBlocks int     // blocks for the prompt and every output token
	hitTokens  int     // prompt tokens found in the cache at admission
	computed   int     // prompt tokens whose KV exists (hits included)
	handled    int     // prompt blocks already considered for caching
	scheduled  int     // tokens scheduled in the current step
	generated  int

	// aborted is set by the handler when the client goes away.
	aborted atomic.Bool

	mu   sync.Mutex
	prog progress
	// wake has room for one signal: several updates between two reads by
	// the handler coalesce into one.
	wake chan struct{}
}

// progress is what the handler learns about its request.
type progress struct {
	admitted     bool
	cachedTokens int
	generated    int
	firstToken   time.Time
	done         bool
	err          error
}

// newRequest returns a request of the adapter lora ("" for the base
// model) that needs blocks for its prompt and maxTokens output tokens.
func newRequest(prompt []uint32, lora string, maxTokens, blockSize int) *request {
	return &request{
		prompt:     prompt,
		hashes:     blockHashes(prompt, blockSize, lora),
		lora:       lora,
		maxTokens:  maxTokens,
		arrived:    time.Now(),
		needBlocks: (len(prompt) + maxTokens + blockSize - 1) / blockSize,
		wake:       make(chan struct{}, 1),
	}
}

// update changes the progress under the lock and wakes the handler.
func (r *request) update(f func(p *progress)) {
	r.mu.Lock()
	f(&r.prog)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// snapshot returns the current progress.
func (r *request) snapshot() progress {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.prog
}

// fail ends the request with err.
func (r *request) fail(err error) {
	r.update(func(p *progress) { p.done, p.err = true, err })
}

// inPrefill reports whether prompt tokens remain to be computed.
func (r *request) inPrefill() bool { return r.computed < len(r.prompt) }
