package selection

import "time"

// SelectTiming is how one Select or SelectAndReserve spent its time, for a
// caller that keeps latency metrics: with many selections in flight on
// few cores, a selection's wall time is mostly waiting, and these split
// the wait for the partition's lock from the rest.
type SelectTiming struct {
	// Total is the call's wall time: hashing the prompt, the index lookup,
	// scoring, booking, and every wait among them.
	Total time.Duration
	// LockWait is the time spent blocked acquiring the partition's lock
	// for the snapshot and the booking (the catalog's check that the
	// partition has a rank, which also takes it briefly, is in Total only).
	LockWait time.Duration
	// LockHeld is the time the call held the partition's lock.
	LockHeld time.Duration
	// Rechosen is true when the rank chosen from the snapshot no longer
	// qualified at booking and the choice was made again under the lock.
	Rechosen bool
}

// Work is the call's time not spent waiting for the partition's lock:
// its CPU work plus any time its thread waited for a CPU (which a
// goroutine cannot tell apart from work), so an upper bound on the work.
func (t SelectTiming) Work() time.Duration { return t.Total - t.LockWait }

// WithSelectTiming calls fn after every Select, SelectAndReserve and
// SelectAndReserveExplained that reached the partition (one that failed
// its checks before is not timed) with how it spent its time. fn runs on
// the caller's goroutine with no lock held; it must be cheap.
func WithSelectTiming(fn func(SelectTiming)) Option { return func(r *Router) { r.selectTiming = fn } }

// lockTimer takes and releases a partition's lock for one selection and
// adds up its waits and holds.
type lockTimer struct {
	start    time.Time
	acquired time.Time
	timing   SelectTiming
}

func newLockTimer() lockTimer { return lockTimer{start: time.Now()} }

func (t *lockTimer) lock(p *partition) {
	if !p.mu.TryLock() {
		// Contended: time the wait. The uncontended path reads no clock
		// for it.
		before := time.Now()
		p.mu.Lock()
		t.acquired = time.Now()
		t.timing.LockWait += t.acquired.Sub(before)
		return
	}
	t.acquired = time.Now()
}

func (t *lockTimer) unlock(p *partition) {
	t.timing.LockHeld += time.Since(t.acquired)
	p.mu.Unlock()
}

// observe reports the finished call to the router's SelectTiming hook.
func (e *selector) observe(t *lockTimer) {
	if e.timing == nil {
		return
	}
	t.timing.Total = time.Since(t.start)
	e.timing(t.timing)
}
