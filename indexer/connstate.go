package indexer

import (
	"sync/atomic"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// A listener's connection to its publisher, as the operator sees it
// (kvrouter_kv_events_connected). vLLM publishes nothing while idle, so
// an idle worker and a dead one look the same to the index; the
// connection tells them apart: a killed engine's socket closes, and the
// redials fail until it is back.

// connState is whether a listener's publisher is connected now.
type connState struct {
	up atomic.Bool
	// known is false where the listener cannot tell (a libzmq SUB whose
	// socket monitor did not start).
	known bool
}

// Connected reports whether l's publisher is connected now, and whether
// l can tell (false: no socket monitor).
func (l *Listener) Connected() (up, known bool) {
	return l.conn.up.Load(), l.conn.known
}

// Connections is, for each rank whose listener can tell, whether its
// publisher is connected now. Bind mode's publishers connect to the
// gateway, several to one socket, and are not in it.
func (m *Manager) Connections() map[selection.Rank]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[selection.Rank]bool, len(m.listeners))
	for r, l := range m.listeners {
		if up, known := l.Connected(); known {
			out[r] = up
		}
	}
	return out
}
