package caddymodule

import (
	"encoding/binary"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/indexer"
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

// kv_events_bind_peers reaches the bind-mode gate: a publisher on another
// address than its worker's endpoint is cut off for its topic under the
// default (worker_host) and heard under any.
func TestKVEventsBindPeersReachTheGate(t *testing.T) {
	for _, c := range []struct {
		peers string
		heard bool
	}{{"", false}, {"worker_host", false}, {"any", true}} {
		t.Run(c.peers, func(t *testing.T) {
			// A port the system chose, free again for the gate to listen on.
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close()
			s, err := newRouterState(selection.Config{UseKVEvents: true, KVEventsBound: true, DefaultBlockSize: 16},
				eventSettings{KVEventsBind: "tcp://" + addr, KVEventsBindPeers: c.peers}, (&Limits{}).events(0), zap.NewNop())
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.Destruct() }()
			id := uint64(5)
			if _, err := s.router.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: &id, ModelName: ptr("m"),
				Endpoint: ptr("127.0.0.2:8000"), BlockSize: ptr(uint32(16))}); err != nil {
				t.Fatal(err)
			}
			pub, err := zmq.NewSocket(zmq.PUB)
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			_ = pub.SetLinger(0)
			_ = pub.SetReconnectIvl(50 * time.Millisecond)
			if err := pub.Connect("tcp://" + addr); err != nil {
				t.Fatal(err)
			}
			ev := &indexer.StoredBlocks{BlockSize: 16, TokenIDs: make([]uint32, 16), BlockHashes: []uint64{1}}
			deadline := time.Now().Add(10 * time.Second)
			for seq := uint64(0); ; seq++ {
				_, _ = pub.SendMessage("kv@5@m", binary.BigEndian.AppendUint64(nil, seq), indexer.AppendBatch(nil, indexer.EncodingMap, 1, 0, ev))
				got := s.events.Stats()
				if heard := got.Events.Batches > 0; heard || got.Events.WrongTopic > 0 {
					if heard != c.heard || (got.Events.WrongTopic > 0) == c.heard {
						t.Fatalf("heard %v, want %v; counts %+v", heard, c.heard, got.Events)
					}
					return
				}
				if time.Now().After(deadline) {
					t.Fatal("the publisher was neither heard nor cut")
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}
