package caddymodule

import (
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

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

// kv_events_max_peers reaches the bind-mode listener: past it, a
// publisher's connection is closed at once and counted.
func TestKVEventsMaxPeersReachTheBindListener(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events")
	limits := (&Limits{KVEventsMaxPeers: 1}).events(0)
	s, err := newRouterState(selection.Config{UseKVEvents: true, DefaultBlockSize: 16},
		eventSettings{KVEventsBind: "ipc://" + path}, limits, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Destruct() }()
	dial := func() net.Conn {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		return c
	}
	if _, err := io.ReadFull(dial(), make([]byte, 10)); err != nil {
		t.Fatalf("the first publisher was not greeted: %v", err)
	}
	if n, err := dial().Read(make([]byte, 64)); err != io.EOF {
		t.Fatalf("the second publisher read %d bytes, %v; want it closed", n, err)
	}
	if got := s.events.Stats().Events.TurnedAway; got != 1 {
		t.Fatalf("turned away %d, want 1", got)
	}
}
