package caddymodule

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// OverloadConfig is the kv_router handler's overload control
// (docs/overload.md): when every worker of a request's model is busy
// (past decode_busy_threshold or prefill_busy_threshold of the kv_router
// app, at max_reservations_per_worker, or marked busy by its own
// "overloaded" answer), the request waits in a bounded queue per model,
// ordered by a priority class, and is answered 429 with Retry-After when
// the queue is full or its wait would pass MaxWait.
type OverloadConfig struct {
	// Off turns the queue off: requests go to a worker however busy the
	// workers are (workers' "overloaded" answers still mark them busy
	// rather than failed). Default: false (the queue is on).
	Off bool `json:"off,omitempty"`

	// QueueSize bounds the requests waiting per model (and routing
	// group); one more is answered 429 at once. Default: 1024.
	QueueSize int `json:"queue_size,omitempty"`

	// MaxWait bounds a request's wait in the queue; past it the request
	// is answered 429. A request whose wait, at the rate the queue has
	// been admitting requests, would pass half of it is answered 429 on
	// arrival (overload.go, predictMargin). Default: 5s.
	MaxWait caddy.Duration `json:"max_wait,omitempty"`

	// PriorityHeader names the request header that holds the request's
	// priority class. Default: X-Priority.
	PriorityHeader string `json:"priority_header,omitempty"`

	// PriorityClasses are the classes, highest first. A waiting request
	// is admitted before every request of a lower class, and after the
	// earlier requests of its own (FIFO). A value that is not one of them,
	// or no value, is DefaultPriority: a client can choose among these
	// classes only. Default: [high, normal, low].
	PriorityClasses []string `json:"priority_classes,omitempty"`

	// DefaultPriority is the class of a request without a known class; it
	// must be one of PriorityClasses. Default: normal (with the default
	// classes), else the last class.
	DefaultPriority string `json:"default_priority,omitempty"`

	// WorkerBusyFor is how long a worker that answered 429, or 503 with
	// Retry-After, counts as busy when its Retry-After gives no time; at
	// most WorkerBusyMax. Default: 1s.
	WorkerBusyFor caddy.Duration `json:"worker_busy_for,omitempty"`

	// WorkerBusyMax bounds the time a worker's Retry-After marks it busy,
	// so one answer cannot take a worker out for long. Default: 10s.
	WorkerBusyMax caddy.Duration `json:"worker_busy_max,omitempty"`
}

// Defaults of OverloadConfig.
const (
	defaultQueueSize      = 1024
	defaultQueueMaxWait   = 5 * time.Second
	defaultPriorityHeader = "X-Priority"
	defaultWorkerBusyFor  = time.Second
	defaultWorkerBusyMax  = 10 * time.Second
	// maxQueueSize bounds queue_size: a waiter costs a goroutine and its
	// request's body, so the operator's bound itself is bounded.
	maxQueueSize = 1 << 20
)

var defaultPriorityClasses = []string{"high", "normal", "low"}

// overloadSettings is an OverloadConfig with its defaults applied.
type overloadSettings struct {
	off            bool
	queueSize      int
	maxWait        time.Duration
	priorityHeader string
	classes        []string
	defaultClass   int
	busyFor        time.Duration
	busyMax        time.Duration
}

// settings validates c (nil is every default) and applies the defaults.
func (c *OverloadConfig) settings() (overloadSettings, error) {
	if c == nil {
		c = &OverloadConfig{}
	}
	s := overloadSettings{off: c.Off, queueSize: c.QueueSize, maxWait: time.Duration(c.MaxWait),
		priorityHeader: c.PriorityHeader, classes: c.PriorityClasses,
		busyFor: time.Duration(c.WorkerBusyFor), busyMax: time.Duration(c.WorkerBusyMax)}
	switch {
	case s.queueSize < 0 || s.queueSize > maxQueueSize:
		return s, fmt.Errorf("overload queue_size must be between 0 and %d", maxQueueSize)
	case s.maxWait < 0 || s.busyFor < 0 || s.busyMax < 0:
		return s, errors.New("overload durations must not be negative")
	}
	if s.queueSize == 0 {
		s.queueSize = defaultQueueSize
	}
	if s.maxWait == 0 {
		s.maxWait = defaultQueueMaxWait
	}
	if s.priorityHeader == "" {
		s.priorityHeader = defaultPriorityHeader
	}
	if len(s.classes) == 0 {
		s.classes = defaultPriorityClasses
	}
	if s.busyFor == 0 {
		s.busyFor = defaultWorkerBusyFor
	}
	if s.busyMax == 0 {
		s.busyMax = defaultWorkerBusyMax
	}
	if s.busyFor > s.busyMax {
		// Each mark would be cut to busy_max: the operator meant one of
		// the two to be otherwise.
		return s, fmt.Errorf("overload worker_busy_for %v is longer than worker_busy_max %v, which bounds every busy mark", s.busyFor, s.busyMax)
	}
	for i, name := range s.classes {
		if name == "" || slices.Contains(s.classes[:i], name) {
			return s, fmt.Errorf("overload priority_classes must be distinct and not empty: %q", s.classes)
		}
	}
	def := c.DefaultPriority
	if def == "" && len(c.PriorityClasses) == 0 {
		def = "normal"
	}
	s.defaultClass = len(s.classes) - 1
	if def != "" {
		if s.defaultClass = slices.Index(s.classes, def); s.defaultClass < 0 {
			return s, fmt.Errorf("overload default_priority %q is not one of priority_classes %q", def, s.classes)
		}
	}
	return s, nil
}

// class is the index of a header value's class (0 highest), the default
// class for an unknown or missing one.
func (s *overloadSettings) class(value string) int {
	if i := slices.Index(s.classes, value); i >= 0 {
		return i
	}
	return s.defaultClass
}

// unmarshalOverload reads the handler's overload subdirective. Syntax:
//
//	overload [off] {
//		queue_size <count>
//		max_wait <duration>
//		priority_header <header>
//		priority_classes <class...>
//		default_priority <class>
//		worker_busy_for <duration>
//		worker_busy_max <duration>
//	}
func unmarshalOverload(d *caddyfile.Dispenser) (*OverloadConfig, error) {
	c := &OverloadConfig{}
	if d.NextArg() {
		if d.Val() != "off" {
			return nil, d.Errf("overload takes only off as an argument, not %q", d.Val())
		}
		c.Off = true
		if d.NextArg() {
			return nil, d.ArgErr()
		}
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "queue_size":
			c.QueueSize, err = parseCount(d)
		case "max_wait":
			c.MaxWait, err = parseDuration(d)
		case "priority_header":
			c.PriorityHeader, err = singleArg(d)
		case "priority_classes":
			c.PriorityClasses = d.RemainingArgs()
			if len(c.PriorityClasses) == 0 {
				err = d.ArgErr()
			}
		case "default_priority":
			c.DefaultPriority, err = singleArg(d)
		case "worker_busy_for":
			c.WorkerBusyFor, err = parseDuration(d)
		case "worker_busy_max":
			c.WorkerBusyMax, err = parseDuration(d)
		default:
			return nil, d.Errf("unrecognized overload subdirective %s", d.Val())
		}
		if err != nil {
			return nil, err
		}
	}
	return c, nil
}
