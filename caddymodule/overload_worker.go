package caddymodule

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// A worker's "overloaded" answer: 429, or 503 with a Retry-After (vLLM and
// SGLang answer 503 for a dead engine too, so a bare 503 stays a failure).
// It marks the worker busy for the Retry-After it gave (within
// worker_busy_max; worker_busy_for when it gave none), not failed: the
// router's health hears a 429, which it counts neither way, and the
// overload queue holds requests back while every worker is busy.

// overloadedAnswer reports whether a worker's answer says it is
// overloaded, and for how long it asked to be left alone (0: unsaid).
func overloadedAnswer(status int, h http.Header) (bool, time.Duration) {
	ra := h.Get("Retry-After")
	switch {
	case status == http.StatusTooManyRequests:
	case status == http.StatusServiceUnavailable && ra != "":
	default:
		return false, 0
	}
	return true, parseRetryAfter(ra, time.Now())
}

// parseRetryAfter reads Retry-After's seconds or HTTP date; 0 when it is
// absent, malformed or past.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// markOverloaded marks the answering worker busy for d, bounded.
func (s *overloadSettings) markOverloaded(health *selection.Health, resp *selection.SelectResponse, d time.Duration) {
	if d <= 0 {
		d = s.busyFor
	}
	health.ReportBusy(resp.WorkerID, min(d, s.busyMax))
	workerBusyTotal.WithLabelValues(modelLabels.of(resp.ModelName)).Inc()
}

// retryAfterSeconds is the Retry-After of a shed request: the queue's
// max_wait, in whole seconds, at least 1.
func (s *overloadSettings) retryAfterSeconds() string {
	return strconv.Itoa(max(1, int((s.maxWait+time.Second-1)/time.Second)))
}
