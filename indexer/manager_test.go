package indexer

import (
	"encoding/binary"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

func ptr[T any](v T) *T { return &v }

// eventRouter is a selection router in event mode, fed by a Manager.
func eventRouter(t *testing.T, bound bool, opts ...ManagerOption) (*selection.Router, *Manager) {
	t.Helper()
	return eventRouterOn(t, New(), bound, opts...)
}

// eventRouterOn is eventRouter over the index x.
func eventRouterOn(t *testing.T, x *Index, bound bool, opts ...ManagerOption) (*selection.Router, *Manager) {
	t.Helper()
	m, err := NewManager(x, nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	cfg := selection.DefaultConfig()
	cfg.UseKVEvents, cfg.KVEventsBound = true, bound
	r, err := selection.NewRouter(cfg, selection.WithIndexer(m.Index), selection.WithCatalogHook(m.OnCatalogChange))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.Close()
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	})
	return r, m
}

// TestManagerFollowsCatalog: a worker registered with its kv_events
// endpoint gets a listener; its events steer /select; an unchanged
// re-upsert keeps the listener, a changed endpoint replaces it, and a
// delete stops it and drops the worker's blocks.
func TestManagerFollowsCatalog(t *testing.T) {
	r, m := eventRouter(t, false)
	pctx, _ := zmq.NewContext()
	pubA := newTestPublisher(t, pctx, true)
	pubB := newTestPublisher(t, pctx, false)
	t.Cleanup(func() { pubA.close(); pubB.close(); _ = pctx.Term() })

	upsert := func(id uint64, ep, replay string) selection.WorkerRecord {
		req := &selection.WorkerRequest{WorkerID: ptr(id), ModelName: ptr("m"), RoutingGroup: ptr("g"), Endpoint: ptr("127.0.0.1:8000"),
			BlockSize: ptr(uint32(lbs)), KVEventsEndpoint: ptr(ep)}
		if replay != "" {
			req.ReplayEndpoint = ptr(replay)
		}
		rec, err := r.Catalog().UpsertWorker(req)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	if rec := upsert(1, "nonsense", ""); rec.Schedulable() || m.Listeners() != 0 {
		t.Fatalf("a bad endpoint must leave the worker incomplete and unheard: %+v", rec.NotSchedulableReasons)
	}
	upsert(1, pubA.pubEP, pubA.replay)
	upsert(2, pubB.pubEP, "")
	pubA.waitSubscribed()
	pubB.waitSubscribed()
	if m.Listeners() != 2 {
		t.Fatalf("%d listeners", m.Listeners())
	}
	prompt := testPrompt(11)
	pubA.publish(chunk(EncodingMap, 0, prompt, 0, 30), true)
	eventually(t, "events applied", func() bool { return m.stats.Batches.Load() >= 1 })
	res, err := r.Select(&selection.SelectRequest{Partition: selection.Partition{ModelName: "m", RoutingGroup: "g"},
		Prompt: selection.Prompt{TokenIDs: prompt}})
	if err != nil {
		t.Fatal(err)
	}
	if res.WorkerID != 1 || res.Overlap.GPU != 30*lbs {
		t.Fatalf("select went to %d with gpu overlap %d; want worker 1 with %d", res.WorkerID, res.Overlap.GPU, 30*lbs)
	}
	// Unchanged re-upsert: the same listener goes on (no new subscription).
	before := m.listeners[selection.Rank{WorkerID: 1}]
	upsert(1, pubA.pubEP, pubA.replay)
	if m.listeners[selection.Rank{WorkerID: 1}] != before {
		t.Fatal("an unchanged re-upsert replaced the listener")
	}
	// A changed endpoint replaces it.
	upsert(1, pubB.pubEP, "")
	pubB.waitSubscribed()
	if m.listeners[selection.Rank{WorkerID: 1}] == before || m.Listeners() != 2 {
		t.Fatal("a changed endpoint did not replace the listener")
	}
	// Delete: the listener stops and the blocks go.
	if _, err := r.Catalog().DeleteWorker(1); err != nil {
		t.Fatal(err)
	}
	if m.Listeners() != 1 || m.Index.Blocks(selection.PartitionKey{Model: "m", Group: "g"}, selection.Rank{WorkerID: 1}) != 0 {
		t.Fatalf("after delete: %d listeners, %d blocks", m.Listeners(),
			m.Index.Blocks(selection.PartitionKey{Model: "m", Group: "g"}, selection.Rank{WorkerID: 1}))
	}
}

// TestWorkerCounts: each worker's publishers' counts are kept apart and
// add up to the totals. Worker 1 sends a payload that does not decode and
// a good one, worker 2 a good one: worker 1 shows the malformed payload,
// worker 2 none; in bind mode too, where every worker's publisher writes
// to one SUB, and a topic naming no worker counts in the totals only.
func TestWorkerCounts(t *testing.T) {
	t.Run("connect", func(t *testing.T) {
		r, m := eventRouter(t, false)
		pctx, _ := zmq.NewContext()
		pubs := []*testPublisher{newTestPublisher(t, pctx, false), newTestPublisher(t, pctx, false)}
		t.Cleanup(func() { pubs[0].close(); pubs[1].close(); _ = pctx.Term() })
		for i, p := range pubs {
			if _, err := r.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: ptr(uint64(i + 1)), ModelName: ptr("m"),
				Endpoint: ptr("127.0.0.1:8000"), BlockSize: ptr(uint32(lbs)), KVEventsEndpoint: ptr(p.pubEP)}); err != nil {
				t.Fatal(err)
			}
			p.waitSubscribed()
		}
		prompt := testPrompt(13)
		pubs[0].publish([]byte{0xc1}, true) // 0xc1 is no msgpack type
		pubs[0].publish(chunk(EncodingArray, -1, prompt, 0, 4), true)
		pubs[1].publish(chunk(EncodingArray, -1, prompt, 0, 4), true)
		eventually(t, "both publishers' batches", func() bool { return m.stats.Batches.Load() >= 2 })
		checkWorkerCounts(t, m, 1)
	})
	t.Run("bind", func(t *testing.T) {
		// One connection speaks for both workers: the gate must let
		// every topic through (PeersAny).
		r, m := eventRouter(t, true, WithBindPeers(PeersAny))
		pub := bindPublisher(t, r, m, &selection.WorkerRequest{WorkerID: ptr(uint64(1)), ModelName: ptr("m"),
			Endpoint: ptr("127.0.0.1:8000"), BlockSize: ptr(uint32(lbs))})
		if _, err := r.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: ptr(uint64(2)), ModelName: ptr("m"),
			Endpoint: ptr("127.0.0.1:8001"), BlockSize: ptr(uint32(lbs))}); err != nil {
			t.Fatal(err)
		}
		send := func(topic string, seq uint64, payload []byte) {
			var s [8]byte
			binary.BigEndian.PutUint64(s[:], seq)
			if _, err := pub.SendMessage(topic, s[:], payload); err != nil {
				t.Fatal(err)
			}
		}
		prompt := testPrompt(13)
		eventually(t, "the first batch", func() bool {
			send("kv@2@m", 0, chunk(EncodingArray, -1, prompt, 0, 4))
			return m.stats.Batches.Load() >= 1
		})
		send("kv@1@m", 0, []byte{0xc1})
		send("kv@1@m", 1, chunk(EncodingArray, -1, prompt, 0, 4))
		send("not-a-topic", 0, chunk(EncodingArray, -1, prompt, 0, 4)) // the totals' only
		eventually(t, "the rest", func() bool { return m.stats.Malformed.Load() >= 2 && m.WorkerCounts()[1].Batches >= 1 })
		checkWorkerCounts(t, m, 2)
	})
}

// checkWorkerCounts: worker 1 raised one malformed payload, worker 2
// none, and the totals hold malformed of them all and at least the
// workers' messages and batches.
func checkWorkerCounts(t *testing.T, m *Manager, malformed uint64) {
	t.Helper()
	by := m.WorkerCounts()
	if by[1].Malformed != 1 || by[2].Malformed != 0 || by[1].Batches != 1 || by[2].Batches < 1 {
		t.Fatalf("by worker: %+v", by)
	}
	total := m.stats.Counts()
	if total.Malformed != malformed || total.Messages < by[1].Messages+by[2].Messages || total.Batches != by[1].Batches+by[2].Batches {
		t.Fatalf("totals %+v against workers %+v", total, by)
	}
}

// bindPublisher binds m's listener, registers worker in r and returns a
// PUB connected to the bound endpoint (reconnecting every 50 ms, so a
// publisher whose connection was dropped is back soon).
func bindPublisher(t *testing.T, r *selection.Router, m *Manager, worker *selection.WorkerRequest) *zmq.Socket {
	t.Helper()
	b, err := m.Bind("tcp://127.0.0.1:*", ResolverFor(r))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Catalog().UpsertWorker(worker); err != nil {
		t.Fatal(err)
	}
	pctx, _ := zmq.NewContext()
	pub, _ := pctx.NewSocket(zmq.PUB)
	_ = pub.SetLinger(0)
	_ = pub.SetReconnectIvl(50 * time.Millisecond)
	t.Cleanup(func() { pub.Close(); _ = pctx.Term() })
	if err := pub.Connect(b.Endpoint()); err != nil {
		t.Fatal(err)
	}
	return pub
}

// TestBindMode: the gateway binds; a publisher connects to it with the
// topic kv@<worker>@<model>; events of a worker not in the catalog are
// rejected.
func TestBindMode(t *testing.T) {
	// Every topic passes the gate (PeersAny), so that one connection
	// reaches the listener's own resolution with each of them;
	// TestBindGateChecksTopics has the gate's checks.
	r, m := eventRouter(t, true, WithBindPeers(PeersAny))
	pub := bindPublisher(t, r, m, &selection.WorkerRequest{WorkerID: ptr(uint64(5)), ModelName: ptr("m"),
		Endpoint: ptr("127.0.0.1:8000"), BlockSize: ptr(uint32(lbs))})
	prompt := testPrompt(12)
	send := func(topic string, seq uint64, payload []byte) {
		var s [8]byte
		binary.BigEndian.PutUint64(s[:], seq)
		if _, err := pub.SendMessage(topic, s[:], payload); err != nil {
			t.Fatal(err)
		}
	}
	// The connection is asynchronous: repeat the first store until it lands.
	eventually(t, "bind-mode events", func() bool {
		send("kv@5@m", 0, chunk(EncodingArray, -1, prompt, 0, 10))
		return m.stats.Batches.Load() >= 1
	})
	send("kv@6@m", 0, chunk(EncodingArray, -1, prompt, 0, 10)) // unknown worker
	send("not-a-topic", 0, chunk(EncodingArray, -1, prompt, 0, 10))
	send("kv@5@m", 1000, chunk(EncodingArray, -1, prompt, 10, 12))
	key := selection.PartitionKey{Model: "m", Group: "default"}
	// Wait for the last message itself: the counters can reach their
	// marks while it is still on its way.
	eventually(t, "the rest", func() bool {
		return m.stats.Messages.Load() >= 2 && m.stats.Malformed.Load() >= 1 && m.Index.Blocks(key, selection.Rank{WorkerID: 5}) == 12
	})
	if m.Index.Blocks(key, selection.Rank{WorkerID: 6}) != 0 || m.stats.Rejected.Load() == 0 {
		t.Fatal("events of a worker outside the catalog were applied")
	}
}
