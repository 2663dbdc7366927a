package indexer

import (
	"encoding/binary"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestListenerDropsUnknownRank (connect mode): a worker with ranks 0 and
// 1 follows a publisher whose batches name dp_rank 1 (applied under it),
// 2 and 2^40 (neither is the worker's: dropped and counted) and none
// (applied under the listener's rank).
func TestListenerDropsUnknownRank(t *testing.T) {
	f := newFixture(t, false, false)
	f.cfg = func(c *ListenerConfig) { c.FirstRank, c.RankCount = 0, 2 }
	f.listen()
	prompt := testPrompt(31)
	f.pub.publish(chunk(EncodingMap, 1, prompt, 0, 6), true)
	f.pub.publish(chunk(EncodingMap, 2, prompt, 0, 7), true)
	f.pub.publish(chunk(EncodingArray, 1<<40, prompt, 0, 7), true)
	f.pub.publish(chunk(EncodingArray, -1, prompt, 0, 4), true)
	f.waitBatches(2)
	if n := f.stats.UnknownRank.Load(); n != 2 {
		t.Fatalf("unknown rank %d, want 2", n)
	}
	for _, tc := range []struct {
		dp   uint32
		want int
	}{{0, 4}, {1, 6}, {2, 0}} {
		if n := f.index.Blocks(part, selection.Rank{WorkerID: f.rank.WorkerID, DPRank: tc.dp}); n != tc.want {
			t.Errorf("rank %d holds %d blocks, want %d", tc.dp, n, tc.want)
		}
	}
}

// TestBindModeDropsUnknownRank: in bind mode a worker registered with
// ranks 4 and 5 publishes batches naming dp_rank 5 (applied), 0 and 6
// (dropped and counted) and none (its first rank, 4). When the publisher
// restarts, rank 5's blocks go as well as rank 4's.
func TestBindModeDropsUnknownRank(t *testing.T) {
	r, m := eventRouter(t, true)
	pub := bindPublisher(t, r, m, &selection.WorkerRequest{WorkerID: ptr(uint64(5)), ModelName: ptr("m"),
		Endpoint: ptr("127.0.0.1:8000"), BlockSize: ptr(uint32(lbs)),
		DataParallelStartRank: ptr(uint32(4)), DataParallelSize: ptr(uint32(2))})
	send := func(seq uint64, payload []byte) {
		var s [8]byte
		binary.BigEndian.PutUint64(s[:], seq)
		if _, err := pub.SendMessage("kv@5@m", s[:], payload); err != nil {
			t.Fatal(err)
		}
	}
	prompt := testPrompt(32)
	// The connection is asynchronous: repeat the first store until it lands.
	eventually(t, "bind-mode events", func() bool {
		send(0, chunk(EncodingMap, 5, prompt, 0, 6))
		return m.stats.Batches.Load() >= 1
	})
	send(1, chunk(EncodingMap, 0, prompt, 0, 7))
	send(2, chunk(EncodingMap, 6, prompt, 0, 7))
	send(3, chunk(EncodingMap, -1, prompt, 0, 3))
	key := selection.PartitionKey{Model: "m", Group: "default"}
	rank := func(dp uint32) int { return m.Index.Blocks(key, selection.Rank{WorkerID: 5, DPRank: dp}) }
	eventually(t, "the last batch", func() bool { return rank(4) == 3 })
	if n := m.stats.UnknownRank.Load(); n != 2 {
		t.Fatalf("unknown rank %d, want 2", n)
	}
	if rank(5) != 6 || rank(0) != 0 || rank(6) != 0 {
		t.Fatalf("ranks 5, 0, 6 hold %d, %d, %d blocks; want 6, 0, 0", rank(5), rank(0), rank(6))
	}
	// A restart: the sequence goes back to 0, with nothing stored yet.
	restarts, batches := m.stats.Restarts.Load(), m.stats.Batches.Load()
	send(0, AppendBatch(nil, EncodingMap, 1, -1))
	eventually(t, "the restart", func() bool { return m.stats.Batches.Load() > batches })
	if m.stats.Restarts.Load() != restarts+1 {
		t.Fatalf("restarts %d, want %d", m.stats.Restarts.Load(), restarts+1)
	}
	if rank(4) != 0 || rank(5) != 0 {
		t.Fatalf("after the restart ranks 4 and 5 hold %d and %d blocks; want none", rank(4), rank(5))
	}
}
