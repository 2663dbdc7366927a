package indexer

import (
	"testing"

	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// FuzzFrames checks the frame checks of live and replayed messages: they
// never panic, and accept exactly the shapes of the wire format.
func FuzzFrames(f *testing.F) {
	f.Add([]byte("topic"), []byte{0, 0, 0, 0, 0, 0, 0, 1}, []byte{0x90}, uint8(3))
	f.Add([]byte{}, []byte{1, 2, 3}, []byte{}, uint8(2))
	f.Fuzz(func(t *testing.T, a, b, c []byte, n uint8) {
		frames := [][]byte{a, b, c, a}[:n%5]
		seq, payload, ok := liveFrames(frames)
		if ok != (len(frames) == 3 && len(frames[1]) == 8) {
			t.Fatalf("live frames %d accepted=%v", len(frames), ok)
		}
		if ok && (len(payload) != len(frames[2]) || seq != seqOf(frames[1])) {
			t.Fatal("live sequence misread")
		}
		if _, _, ok := replayFrames(frames); ok {
			rest := frames
			if len(rest) > 0 && len(rest[0]) == 0 {
				rest = rest[1:]
			}
			if len(rest) == 3 {
				rest = rest[1:]
			}
			if len(rest) != 2 || len(rest[0]) != 8 {
				t.Fatalf("replay frames %q accepted", frames)
			}
		}
	})
}

func seqOf(b []byte) uint64 {
	var v uint64
	for _, x := range b {
		v = v<<8 | uint64(x)
	}
	return v
}

// FuzzDeliver drives a publisher's sequence through the listener's
// ordering logic with arbitrary sequence numbers (no replay endpoint) and
// checks that it never panics and keeps the index consistent.
func FuzzDeliver(f *testing.F) {
	f.Add(uint64(0), uint64(1), uint64(2), uint64(5), uint64(1))
	f.Add(uint64(3), uint64(3), uint64(0), ^uint64(0), uint64(7))
	f.Fuzz(func(t *testing.T, s1, s2, s3, s4, s5 uint64) {
		x := New()
		x.ConfigurePartition(part, 4, false)
		var stats Stats
		st := &stream{cfg: ListenerConfig{Partition: part, Rank: selection.Rank{WorkerID: 1}}, index: x, stats: &stats, log: zap.NewNop(),
			turn: &ingestTurn{x: x}}
		prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
		for i, s := range []uint64{s1, s2, s3, s4, s5} {
			h := uint64(i + 1)
			payload := AppendBatch(nil, EncodingMap, 1, 0, &StoredBlocks{BlockHashes: []uint64{h * 10, h*10 + 1}, TokenIDs: prompt, BlockSize: 4})
			st.deliver(s, payload)
		}
		if x.Entries() != int64(x.Blocks(part, st.cfg.Rank)) {
			t.Fatalf("entries %d, blocks %d", x.Entries(), x.Blocks(part, st.cfg.Rank))
		}
		if stats.Batches.Load()+stats.Stale.Load() != 5 {
			t.Fatalf("batches %d + stale %d != 5 delivered", stats.Batches.Load(), stats.Stale.Load())
		}
	})
}
