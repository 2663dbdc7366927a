package selection

import (
	"reflect"
	"sync/atomic"
)

// liveConfig is the router's configuration as its parts read it: one
// pointer, swapped whole by Reconfigure, so a request reads one consistent
// Config (one atomic load) and a reload never waits for requests.
type liveConfig struct{ p atomic.Pointer[Config] }

func newLiveConfig(cfg Config) *liveConfig {
	l := new(liveConfig)
	l.p.Store(&cfg)
	return l
}

// get is the configuration in force.
func (l *liveConfig) get() *Config { return l.p.Load() }

// fixedSettings are the Config fields a running router cannot change:
// the parts they shape are built once, when the router is, and hold what
// was gathered under them.
//   - UseKVEvents, KVEventsBound: which index feeds the router, and
//     whether workers need event endpoints of their own.
//   - TrackActiveBlocks: the load of every booking in flight was added
//     under it and must be removed under it.
//   - ApproxTTL: the approximate index's entries were stamped with it.
//   - PendingTTL, PendingMaxEntries, PendingMaxBytes: the pending cache is
//     sized at creation.
//   - SessionAffinityTTL, SessionAffinitySoft, SessionTableCap: the session
//     table exists (or not) and is sized at creation.
var fixedSettings = []string{
	"UseKVEvents", "KVEventsBound", "TrackActiveBlocks", "ApproxTTL",
	"PendingTTL", "PendingMaxEntries", "PendingMaxBytes",
	"SessionAffinityTTL", "SessionAffinitySoft", "SessionTableCap",
}

// Reconfigure applies cfg to the running router, keeping its workers,
// bookings, index and sessions. Every setting takes effect at once except
// the fixed ones (fixedSettings), which keep their running values: it
// returns the names of those that cfg would have changed, so the caller
// can say that they need a restart. A cfg that does not validate changes
// nothing.
func (r *Router) Reconfigure(cfg Config) (fixed []string, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	old := r.cfg.get()
	next := cfg
	nv, ov := reflect.ValueOf(&next).Elem(), reflect.ValueOf(old).Elem()
	for _, name := range fixedSettings {
		f, o := nv.FieldByName(name), ov.FieldByName(name)
		if !reflect.DeepEqual(f.Interface(), o.Interface()) {
			fixed = append(fixed, name)
			f.Set(o)
		}
	}
	if next.Rand == nil {
		next.Rand = old.Rand
	}
	r.cfg.p.Store(&next)
	return fixed, nil
}
