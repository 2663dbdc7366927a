package indexer

import (
	"bytes"
	"errors"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// FuzzDecode feeds arbitrary payloads to the event decoder and applies
// what it accepts to an index. Invariants: no panic; a rejected payload is
// an ErrPayload; an accepted one is valid msgpack for an independent
// decoder, its events are well formed, and applying them leaves the
// index's entry count equal to the sum of its ranks' blocks.
func FuzzDecode(f *testing.F) {
	parent := uint64(3)
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		f.Add(AppendBatch(nil, enc, 1, 0, &StoredBlocks{BlockHashes: []uint64{1, 2}, TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4}))
		f.Add(AppendBatch(nil, enc, 1, -1, &StoredBlocks{BlockHashes: []uint64{4}, Parent: &parent, TokenIDs: []uint32{9, 9, 9, 9}, BlockSize: 4, Medium: "CPU"},
			Removal{BlockHashes: []uint64{1}}, Clear{}))
	}
	f.Add([]byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0x92, 0x01, 0x91, 0x94, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x91, 0xc4, 0x01, 0x07, 0xc0, 0x92, 0x91, 0x01, 0x02})
	f.Fuzz(func(t *testing.T, payload []byte) {
		var d Decoder
		b, err := d.Decode(payload)
		if err != nil {
			if !errors.Is(err, ErrPayload) {
				t.Fatalf("error %v is not ErrPayload", err)
			}
			return
		}
		// The reference walks the payload as one msgpack value (Skip checks
		// the structure without building values, so any key type is fine).
		rd := bytes.NewReader(payload)
		ref := msgpack.NewDecoder(rd)
		if err := ref.Skip(); err != nil || rd.Len() != 0 {
			t.Fatalf("accepted a payload the reference decoder rejects (%v): %x", err, payload)
		}
		x := New()
		x.ConfigurePartition(part, 4, false)
		r := selection.Rank{WorkerID: 1}
		for i := range b.Events {
			ev := &b.Events[i]
			if ev.Kind < Stored || ev.Kind > Cleared {
				t.Fatalf("event kind %d", ev.Kind)
			}
			_ = x.Apply(part, r, ev)
		}
		if x.Entries() != int64(x.Blocks(part, r)) {
			t.Fatalf("index entries %d, rank blocks %d", x.Entries(), x.Blocks(part, r))
		}
		var m selection.Matches
		x.FindMatches(part, []uint64{1, 2, 3}, &m)
	})
}
