package caddymodule

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// reserve runs the request through the overload queue and books a
// worker; answered is true when the request was answered 429 instead (or
// its client left). A request that went straight on, on a not-busy answer
// up to clearFor old, and found every worker full (503) waits in the
// queue and tries once more, so that it is not refused for the age of
// that answer. took is the time the booking itself took.
func (h *Handler) reserve(w http.ResponseWriter, r *http.Request, req *selection.SelectRequest, scope lineScope, mode string) (res *selection.Reservation, took time.Duration, answered bool, err error) {
	lr := lineRequest{part: req.Partition, scope: scope, placement: &req.Placement}
	queued, ok := h.admitOrShed(w, r, lr, mode)
	if !ok {
		return nil, 0, true, nil
	}
	start := time.Now()
	res, err = h.router.Reserve(req, h.Explain)
	took = time.Since(start)
	h.booked(req.Partition, queued) // the next waiter may look for capacity now
	if err == nil || h.queue == nil || selection.StatusOf(err) != http.StatusServiceUnavailable {
		return res, took, false, err
	}
	// Every worker it may go to was full after all: a not-busy answer
	// reused, or a place another request took first. It waits (again)
	// rather than get a 503, once.
	h.queue.forgetClear(req.Partition.Key())
	if queued, ok = h.admitOrShed(w, r, lr, mode); !ok {
		return nil, 0, true, nil
	}
	start = time.Now()
	res, err = h.router.Reserve(req, h.Explain)
	took = time.Since(start)
	h.booked(req.Partition, queued)
	return res, took, false, err
}

// booked tells the queue a request has booked its worker, or failed to:
// one it admitted lets the next be admitted; any other, a freed place
// (a failed booking) may let a waiter on.
func (h *Handler) booked(part selection.Partition, queued bool) {
	switch {
	case h.queue == nil:
	case queued:
		h.queue.settled(part.Key())
	default:
		h.queue.kick(part.Key())
	}
}

// admitOrShed runs a request through the overload queue: ok when it may
// book a worker (queued: after a wait); not ok when it was answered 429
// (or its client left).
func (h *Handler) admitOrShed(w http.ResponseWriter, r *http.Request, lr lineRequest, mode string) (queued, ok bool) {
	if h.queue == nil {
		return false, true
	}
	class := h.overload.class(strings.TrimSpace(r.Header.Get(h.overload.priorityHeader)))
	a := h.queue.wait(r.Context(), lr, class)
	model := modelLabels.of(lr.part.Key().Model)
	if a.shed == "" {
		if a.queued {
			queueAdmittedTotal.WithLabelValues(model).Inc()
			queueWaitSeconds.WithLabelValues(model, "admitted").Observe(a.waited.Seconds())
		}
		return a.queued, true
	}
	queueShedTotal.WithLabelValues(model, string(a.shed)).Inc()
	if a.queued {
		queueWaitSeconds.WithLabelValues(model, "shed").Observe(a.waited.Seconds())
	}
	if a.shed == shedCanceled {
		return true, false // no one to answer
	}
	requestsTotal.WithLabelValues(model, "shed", mode).Inc()
	w.Header().Set("Retry-After", h.overload.retryAfterSeconds())
	writeOpenAIError(w, http.StatusTooManyRequests, shedMessage(a.shed, h.overload.maxWait))
	return true, false
}

// shedMessage is the client-facing text of a 429 from the queue.
func shedMessage(reason shedReason, maxWait fmt.Stringer) string {
	switch reason {
	case shedDeadline:
		return fmt.Sprintf("every worker of the model stayed busy for %s; retry later", maxWait)
	case shedClosing:
		return "the gateway is reloading; retry"
	case shedPredictedWait:
		return fmt.Sprintf("every worker of the model is busy, and at the rate the queue admits requests this one would wait past %s; retry later", maxWait)
	}
	return "every worker of the model is busy and the queue is full; retry later"
}

// kickQueue wakes the head of the partition's line, if any.
func (h *Handler) kickQueue(part selection.Partition) {
	if h.queue != nil {
		h.queue.kick(part.Key())
	}
}
