package caddymodule

import (
	"testing"

	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// kv_events_cores reaches the index the router is built with.
func TestKVEventsCoresReachTheIndex(t *testing.T) {
	limits := (&Limits{KVEventsCores: 3}).events(0)
	s, err := newRouterState(selection.Config{UseKVEvents: true, DefaultBlockSize: 16}, eventSettings{}, limits, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Destruct() }()
	if got := s.events.Index.IngestCores; got != 3 {
		t.Fatalf("IngestCores %d, want 3", got)
	}
}
