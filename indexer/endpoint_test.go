package indexer

import (
	"testing"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestManagerEndpointChangeRestarts: a worker whose HTTP endpoint changes
// is a different server. Its listener is replaced although its ZMQ
// endpoint is the same, its index entries are dropped, and the new
// listener applies the publisher's next events from a fresh sequence. An
// upsert that keeps the endpoint keeps the listener and the entries.
func TestManagerEndpointChangeRestarts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from, to *string
		restart  bool
	}{
		{"same endpoint", ptr("127.0.0.1:8000"), ptr("127.0.0.1:8000"), false},
		{"new endpoint", ptr("127.0.0.1:8000"), ptr("127.0.0.1:9000"), true},
		{"endpoint set", nil, ptr("127.0.0.1:9000"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewManager(New(), nil)
			if err != nil {
				t.Fatal(err)
			}
			pctx, _ := zmq.NewContext()
			pub := newTestPublisher(t, pctx, false)
			t.Cleanup(func() {
				_ = m.Close()
				pub.close()
				_ = pctx.Term()
			})
			rec := func(ep *string) *selection.WorkerRecord {
				return &selection.WorkerRecord{WorkerID: 7, ModelName: "m", RoutingGroup: "g", Endpoint: ep,
					KVEventsEndpoint: ptr(pub.pubEP), BlockSize: ptr(uint32(lbs)), DataParallelSize: 1}
			}
			r := selection.Rank{WorkerID: 7}
			old := rec(tc.from)
			m.OnCatalogChange(nil, old)
			pub.waitSubscribed()
			pub.publish(chunk(EncodingMap, 0, testPrompt(41), 0, 10), true)
			eventually(t, "the first batch", func() bool { return m.stats.Batches.Load() == 1 })
			before := m.listeners[r]

			m.OnCatalogChange(old, rec(tc.to))
			if replaced := m.listeners[r] != before; replaced != tc.restart || m.Listeners() != 1 {
				t.Fatalf("listener replaced %v (want %v), %d listeners", replaced, tc.restart, m.Listeners())
			}
			want := 10
			if tc.restart {
				want = 0
				pub.waitResubscribed() // the new listener's subscription
			}
			if n := m.Index.Blocks(part, r); n != want {
				t.Fatalf("%d blocks after the upsert, want %d", n, want)
			}
			pub.publish(chunk(EncodingMap, 0, testPrompt(42), 0, 5), true)
			eventually(t, "the next batch", func() bool { return m.stats.Batches.Load() == 2 })
			if n := m.Index.Blocks(part, r); n != want+5 {
				t.Fatalf("%d blocks after the next batch, want %d", n, want+5)
			}
			if m.stats.Restarts.Load() != 0 {
				t.Fatalf("%d restarts counted", m.stats.Restarts.Load())
			}
		})
	}
}
