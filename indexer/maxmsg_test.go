package indexer

import (
	"encoding/binary"
	"runtime"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestListenerOversizedMessage: a real publisher sends a 64 MiB frame to a
// listener capped at 1 MiB, live or in a replay. The listener refuses it
// from its size header (the native reader live, libzmq in a replay), so
// the Go heap never allocates it; the live connection is cut (counted in
// Cut) and dialed again, the replay exchange ends at its timeout with the
// sequence lost; and later small messages are applied.
func TestListenerOversizedMessage(t *testing.T) {
	const frame = 64 << 20
	for _, tc := range []struct {
		name   string
		replay bool // the frame is lost on the wire and offered by replay
	}{
		{"live", false},
		{"replay", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The replay timeout is long enough for 64 MiB to cross
			// loopback had it been accepted (well under a second here),
			// so the bound, not the timeout, is what keeps it out.
			f := newFixtureTimeout(t, tc.replay, false, 3*time.Second)
			f.cfg = func(c *ListenerConfig) { c.MaxMessageBytes = 1 << 20 }
			f.listen()
			first, later := testPrompt(51), testPrompt(52)
			f.pub.publish(chunk(EncodingMap, 0, first, 0, 5), true)
			f.waitBatches(1)

			big := make([]byte, frame) // allocated before the baseline: only the listener's allocations count
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			f.pub.publish(big, !tc.replay)
			if !tc.replay {
				eventually(t, "the cut connection", func() bool { return f.stats.Cut.Load() >= 1 })
				f.pub.waitResubscribed() // the listener dialed again
			}
			f.pub.publish(chunk(EncodingMap, 0, later, 0, 5), true)
			f.waitBatches(2)
			runtime.ReadMemStats(&after)
			runtime.KeepAlive(big)

			if grown := after.TotalAlloc - before.TotalAlloc; grown >= frame/4 {
				t.Fatalf("the Go heap allocated %d bytes for a %d-byte frame the listener must refuse", grown, frame)
			}
			if f.depth(f.rank, first) != 5 || f.depth(f.rank, later) != 5 {
				t.Fatalf("depths %d and %d, want 5 and 5", f.depth(f.rank, first), f.depth(f.rank, later))
			}
			if f.stats.Malformed.Load() != 0 {
				t.Fatalf("%d malformed: the frame reached the decoder", f.stats.Malformed.Load())
			}
			if tc.replay && (f.stats.Replays.Load() != 1 || f.stats.Replayed.Load() != 0 || f.stats.Lost.Load() != 1) {
				t.Fatalf("replays %d replayed %d lost %d; want 1, 0, 1",
					f.stats.Replays.Load(), f.stats.Replayed.Load(), f.stats.Lost.Load())
			}
		})
	}
}

// TestBindListenerOversizedMessage: bind mode has the same bound, set
// through the manager's option. A publisher that sends a 64 MiB frame is
// cut at the frame's header (counted in Cut), without the frame being
// allocated; it reconnects by itself and its next small batch is applied.
func TestBindListenerOversizedMessage(t *testing.T) {
	const frame = 64 << 20
	r, m := eventRouter(t, true, WithMaxMessageBytes(1<<20))
	pub := bindPublisher(t, r, m, &selection.WorkerRequest{WorkerID: ptr(uint64(5)), ModelName: ptr("m"),
		Endpoint: ptr("127.0.0.1:8000"), BlockSize: ptr(uint32(lbs))})
	// Sends repeat until one lands (the connections are asynchronous),
	// each under the next sequence: a repeated one would be a restart.
	var seq uint64
	send := func(payload []byte) {
		var s [8]byte
		binary.BigEndian.PutUint64(s[:], seq)
		seq++
		if _, err := pub.SendMessage("kv@5@m", s[:], payload); err != nil {
			t.Fatal(err)
		}
	}
	first, later := testPrompt(53), testPrompt(54)
	eventually(t, "the first batch", func() bool {
		send(chunk(EncodingMap, -1, first, 0, 5))
		return m.stats.Batches.Load() >= 1
	})
	big := make([]byte, frame)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	send(big)
	eventually(t, "the cut connection", func() bool { return m.stats.Cut.Load() >= 1 })
	batches := m.stats.Batches.Load()
	eventually(t, "a batch after the reconnect", func() bool {
		send(chunk(EncodingMap, -1, later, 0, 5))
		return m.stats.Batches.Load() > batches
	})
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(big)
	if grown := after.TotalAlloc - before.TotalAlloc; grown >= frame/4 {
		t.Fatalf("the Go heap allocated %d bytes for a %d-byte frame the listener must refuse", grown, frame)
	}
	key := selection.PartitionKey{Model: "m", Group: "default"}
	if n := m.Index.Blocks(key, selection.Rank{WorkerID: 5}); n != 10 {
		t.Fatalf("%d blocks, want 10", n)
	}
	if m.stats.Malformed.Load() != 0 {
		t.Fatalf("%d malformed: the frame reached the decoder", m.stats.Malformed.Load())
	}
}
