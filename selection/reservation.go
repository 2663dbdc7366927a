package selection

import (
	"sync"
	"sync/atomic"
)

// Reservation is one proxied request's booking, from select-and-reserve
// to free, with its failovers. It keeps the lifecycle's "exactly once"
// rules, so a caller only maps its own events onto its methods: the
// worker's answer (Answered), the first response byte (PrefillDone), each
// output block (OutputBlock), an attempt that got no answer (Failed, which
// moves the booking to the best rank not tried yet) and the end of the
// request, however it ends (Release).
//
// Every method is safe to call concurrently, in any order and any number
// of times. Each effect happens at most once per booking: the router's
// health hears about a booking once (Answered or Failed, whichever comes
// first), its prefill completes once, and it is freed once. After Release
// the handle books nothing more. Bookings are keyed by selection id like
// any other, so the router's TTL sweep still frees one whose handle is
// never released.
type Reservation struct {
	books   ledger
	explain bool
	// prefilled is true once the current booking's prefill is complete:
	// PrefillDone's lock-free path for every later response byte. It is
	// only set, and reset on a failover, with mu held.
	prefilled atomic.Bool

	mu sync.Mutex
	// req is the caller's request, copied: a failover books it again with
	// a fresh selection id and the tried ranks excluded.
	req  SelectRequest
	resp *SelectResponse // the booking held or held last; nil once a failover found none
	held bool            // resp's booking is live: neither freed by Failed nor by Release
	told bool            // the router's health has heard about resp's booking
	// served is true once the worker answered resp's booking 2xx: its
	// deferred record (RecordOnAnswer) waits for that and for the first
	// response byte, whichever comes second.
	served bool
	done   bool // Release ran
}

// Reserve selects the cheapest rank for req and books it, as
// SelectAndReserve does (with explain, as SelectAndReserveExplained does,
// on the first booking and on every failover). The handle keeps a copy of
// req, and refers to its token buffers until it is released.
//
// A request for a model no catalog worker serves is refused with a 404 in
// vLLM's words, so that a proxy never sends it to another model's worker;
// a served model with no schedulable worker gets the 503 a selection gets.
func (r *Router) Reserve(req *SelectRequest, explain bool) (*Reservation, error) {
	h, err := reserve((*routerLedger)(r), req, explain)
	// Only a refusal asks whether the model is served: a served model
	// books without the extra catalog lookup, and an unserved one has no
	// schedulable partition, so it is never booked; whatever else is wrong
	// with its request, "no such model" is the answer.
	if err != nil && !r.catalog.ServesModel(req.Partition.Key().Model) {
		return nil, errorf(KindNotFound, "The model `%s` does not exist.", req.ModelName)
	}
	return h, err
}

func reserve(books ledger, req *SelectRequest, explain bool) (*Reservation, error) {
	h := &Reservation{books: books, explain: explain, req: *req}
	resp, err := books.reserve(&h.req, explain)
	if err != nil {
		return nil, err
	}
	h.resp, h.held = resp, true
	return h, nil
}

// Response is the current booking's selection: the booking held, or,
// after Release, the one held last. It is nil when a failover found no
// rank left. The caller must not change it.
func (h *Reservation) Response() *SelectResponse {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.resp
}

// Target is the current booking's endpoint as host:port (HostPort), the
// address to send the request to; empty when Response is nil.
func (h *Reservation) Target() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.resp == nil {
		return ""
	}
	return HostPort(h.resp.Endpoint)
}

// Answered records the worker's HTTP answer for the current booking in the
// router's health, the way Health.ReportStatus sorts statuses (502, 503
// and 504 a failure, 429 neither, anything else a success). Only the first
// word about a booking counts: a later Answered, or a Failed, tells the
// health nothing more about it. After Release it still speaks for the
// booking held last, since it is the worker, not the booking, it judges.
func (h *Reservation) Answered(status int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.resp == nil || h.told {
		return
	}
	h.told = true
	h.books.reportStatus(h.resp.WorkerID, status)
	if status >= 200 && status < 300 {
		h.served = true
		if h.prefilled.Load() {
			h.recordServed()
		}
	}
}

// recordServed records the current booking's deferred record, once, when
// the worker has answered it 2xx and sent its first byte. The status alone
// does not say the prompt was prefilled: vLLM sends a stream's 200 before
// its engine takes the request, and a client that goes away then leaves
// nothing cached.
func (h *Reservation) recordServed() {
	if d := h.resp.record; d != nil && h.served {
		h.resp.record = nil
		h.books.record(d)
	}
}

// PrefillDone marks the current booking's prefill complete (the first
// response byte), once per booking; it does nothing once the booking is
// freed.
func (h *Reservation) PrefillDone() {
	if h.prefilled.Load() {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.held || h.prefilled.Load() {
		return
	}
	h.prefilled.Store(true)
	_ = h.books.prefillComplete(h.resp.SelectionID)
	h.recordServed()
}

// OutputBlock adds one output block to the current booking, as
// Router.AddOutputBlock does (every call adds one). It fails when the
// handle holds no booking.
func (h *Reservation) OutputBlock(decay *float64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.held {
		return errorf(KindNotFound, "the reservation holds no booking")
	}
	return h.books.outputBlock(h.resp.SelectionID, decay)
}

// Failed records that the attempt on the current booking's rank failed (a
// dial error, no answer): it reports the failure to the router's health
// (unless Answered already spoke for this booking), frees the booking, and
// books the best rank not tried yet, every rank the handle has booked and
// the request's own ExcludeRanks excluded. It returns false, and the
// handle then holds nothing, when no rank is left or the booking fails;
// it returns false and changes nothing once the handle holds no booking
// (after Release, or after a Failed that found none).
func (h *Reservation) Failed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.held {
		return false
	}
	old := h.resp
	if !h.told {
		h.books.reportFailure(old.WorkerID)
	}
	_ = h.books.free(old.SelectionID)
	h.held = false
	// A fresh id, and the tried rank added to the request's exclusions in
	// a copy: the caller's slice stays as it was.
	ex := h.req.Placement.ExcludeRanks
	h.req.Placement.ExcludeRanks = append(ex[:len(ex):len(ex)], Rank{WorkerID: old.WorkerID, DPRank: old.DPRank})
	h.req.SelectionID = ""
	resp, err := h.books.reserve(&h.req, h.explain)
	if err != nil {
		h.resp = nil
		return false
	}
	h.resp, h.held, h.told, h.served = resp, true, false, false
	h.prefilled.Store(false)
	return true
}

// Release frees the booking the handle holds, once; later calls, and every
// other method's booking effects after it, do nothing.
func (h *Reservation) Release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done {
		return
	}
	h.done = true
	if h.held {
		h.held = false
		_ = h.books.free(h.resp.SelectionID)
	}
}

// ledger is what a Reservation asks of the router. Router's is
// routerLedger; the tests count the calls through their own.
type ledger interface {
	reserve(req *SelectRequest, explain bool) (*SelectResponse, error)
	prefillComplete(id string) error
	outputBlock(id string, decay *float64) error
	free(id string) error
	reportStatus(workerID uint64, status int)
	reportFailure(workerID uint64)
	record(d *bookingRecord)
}

// routerLedger is a Router seen as a ledger.
type routerLedger Router

func (l *routerLedger) router() *Router { return (*Router)(l) }

func (l *routerLedger) reserve(req *SelectRequest, explain bool) (*SelectResponse, error) {
	if explain {
		return l.router().SelectAndReserveExplained(req)
	}
	return l.router().SelectAndReserve(req)
}

func (l *routerLedger) prefillComplete(id string) error { return l.router().PrefillComplete(id) }

func (l *routerLedger) outputBlock(id string, decay *float64) error {
	return l.router().AddOutputBlock(id, decay)
}

func (l *routerLedger) free(id string) error { return l.router().Free(id) }

func (l *routerLedger) reportStatus(workerID uint64, status int) {
	l.router().Health().ReportStatus(workerID, status)
}

func (l *routerLedger) reportFailure(workerID uint64) { l.router().Health().ReportFailure(workerID) }

func (l *routerLedger) record(d *bookingRecord) { l.router().sel.record(d) }
