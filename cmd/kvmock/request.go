package main

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	enginemodel "github.com/kvrouter/caddy-kvrouter/internal/engine"
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
	prompt  []uint32
	lora    string // the LoRA adapter serving it, "" for the base model
	salt    string // its cache_salt, "" for none
	key     string // its SGLang extra_key, "" for none
	arrived time.Time

	// seq is the scheduler's state (internal/engine): the prompt's block
	// hashes, its output length, its blocks and progress. Scheduler-owned.
	seq enginemodel.Seq

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
// model), salted by salt ("" for none), that needs blocks for its prompt
// and maxTokens output tokens.
func newRequest(prompt []uint32, lora, salt, key string, maxTokens, blockSize int) *request {
	return &request{
		prompt:  prompt,
		lora:    lora,
		salt:    salt,
		key:     key,
		arrived: time.Now(),
		seq:     enginemodel.NewSeq(len(prompt), blockHashes(prompt, blockSize, lora, salt+keyPart(key)), maxTokens, blockSize),
		wake:    make(chan struct{}, 1),
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

// State is the request's scheduler state (enginemodel.Request).
func (r *request) State() *enginemodel.Seq { return &r.seq }
