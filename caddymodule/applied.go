package caddymodule

import (
	"sync"

	"go.uber.org/zap"
)

// appliedConfigs tracks which config's settings and declared workers the
// shared router holds, so that a load that fails after App.Start has
// applied them can be undone. Caddy starts a new config's apps while the
// old config still runs, then stops the old config's apps once every new
// app has started; when a new app fails to start, it stops the new apps
// that had started and the old config goes on. So a Stop while this
// config is the one applied, with the config it replaced not yet stopped,
// means this config's load failed.
type appliedConfigs struct {
	mu sync.Mutex
	// active applied itself last; previous is the config it replaced,
	// until previous is stopped (active's load went through).
	active, previous *App
}

// began records that a applies itself now, and returns the config whose
// settings and workers the router holds until then (nil for none).
func (s *routerState) began(a *App) *App {
	s.applied.mu.Lock()
	defer s.applied.mu.Unlock()
	prev := s.applied.active
	s.applied.active, s.applied.previous = a, prev
	return prev
}

// stopped is called from a's Stop: when a is the config applied last and
// the one it replaced still runs, a's load failed, and the router goes
// back to the one it replaced; when another config is applied, a was
// replaced, and that config's load went through.
func (s *routerState) stopped(a *App, logger *zap.Logger) {
	s.applied.mu.Lock()
	active, previous := s.applied.active, s.applied.previous
	if active != a {
		s.applied.previous = nil
	}
	s.applied.mu.Unlock()
	if active == a && previous != nil {
		s.restore(a, previous, logger)
	}
}

// restore puts back the settings and declared workers of to (the running
// config) after failed's load failed.
func (s *routerState) restore(failed, to *App, logger *zap.Logger) {
	s.applied.mu.Lock()
	if s.applied.active == failed {
		s.applied.active, s.applied.previous = to, nil
	}
	s.applied.mu.Unlock()
	if to == nil {
		return
	}
	if _, err := s.router.Reconfigure(to.settings); err != nil {
		logger.Error("restoring the running config's kv_router settings", zap.Error(err))
	}
	if _, err := s.syncWorkers(to.workers, logger); err != nil {
		logger.Error("restoring the running config's workers", zap.Error(err))
	}
	logger.Warn("the new config did not load: the running config's kv_router settings and workers are back")
}
