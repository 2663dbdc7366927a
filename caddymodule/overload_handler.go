package caddymodule

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// admitOrShed runs a request through the overload queue: true when it may
// book a worker; false when it was answered 429 (or its client left).
func (h *Handler) admitOrShed(w http.ResponseWriter, r *http.Request, part selection.Partition, mode string) bool {
	if h.queue == nil {
		return true
	}
	class := h.overload.class(strings.TrimSpace(r.Header.Get(h.overload.priorityHeader)))
	a := h.queue.wait(r.Context(), part, class)
	model := part.Key().Model
	if a.shed == "" {
		if a.queued {
			queueAdmittedTotal.WithLabelValues(model).Inc()
			queueWaitSeconds.WithLabelValues(model, "admitted").Observe(a.waited.Seconds())
		}
		return true
	}
	queueShedTotal.WithLabelValues(model, string(a.shed)).Inc()
	if a.queued {
		queueWaitSeconds.WithLabelValues(model, "shed").Observe(a.waited.Seconds())
	}
	if a.shed == shedCanceled {
		return false // no one to answer
	}
	requestsTotal.WithLabelValues(model, "shed", mode).Inc()
	w.Header().Set("Retry-After", h.overload.retryAfterSeconds())
	writeOpenAIError(w, http.StatusTooManyRequests, shedMessage(a.shed, h.overload.maxWait))
	return false
}

// shedMessage is the client-facing text of a 429 from the queue.
func shedMessage(reason shedReason, maxWait fmt.Stringer) string {
	switch reason {
	case shedDeadline:
		return fmt.Sprintf("every worker of the model stayed busy for %s; retry later", maxWait)
	case shedClosing:
		return "the gateway is reloading; retry"
	}
	return "every worker of the model is busy and the queue is full; retry later"
}

// kickQueue wakes the head of the partition's line, if any.
func (h *Handler) kickQueue(part selection.Partition) {
	if h.queue != nil {
		h.queue.kick(part.Key())
	}
}
