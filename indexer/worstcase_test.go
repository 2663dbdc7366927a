package indexer

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestMillionElementEvents feeds the decoder and the index the 10^6-element
// arrays issue 6 names: a BlockRemoved of a million hashes nobody holds, a
// batch of a million events, and a BlockStored claiming a million blocks
// with tokens for only two. The decoder refuses each as a payload past
// its bounds (maxEventsPerPayload, maxHashesPerPayload); the index, given
// the removal and the store as events, applies the one and refuses the
// other; what it held before is exactly what it holds after.
func TestMillionElementEvents(t *testing.T) {
	const n = 1_000_000
	const bs = 2
	x := New()
	x.ConfigurePartition(part, bs, false)
	r := selection.Rank{WorkerID: 1}
	held := &Event{Kind: Stored, BlockSize: bs, TokenIDs: []uint32{1, 2, 3, 4}, BlockHashes: []uint64{11, 12}}
	if err := x.Apply(part, r, held); err != nil {
		t.Fatal(err)
	}
	entries := x.Entries()

	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = uint64(1_000 + i) // none of them held
	}
	many := make([]any, n)
	for i := range many {
		many[i] = Removal{BlockHashes: []uint64{uint64(5_000_000 + i)}}
	}
	var d Decoder
	for name, payload := range map[string][]byte{
		"a million-hash removal": AppendBatch(nil, EncodingMap, 1, 0, Removal{BlockHashes: hashes}),
		"a million-event batch":  AppendBatch(nil, EncodingArray, 2, 0, many...),
		"a million blocks over two tokens": AppendBatch(nil, EncodingMap, 3, 0,
			&StoredBlocks{BlockHashes: hashes, TokenIDs: []uint32{5, 6}, BlockSize: bs}),
	} {
		if _, err := d.Decode(payload); !errors.Is(err, ErrPayload) || !strings.Contains(err.Error(), "more than") {
			t.Errorf("%s: %v, want a payload past its bounds", name, err)
		}
	}

	if err := x.Apply(part, r, &Event{Kind: Removed, BlockHashes: hashes}); err != nil {
		t.Fatal(err)
	}
	// A million block hashes over two tokens: the index refuses the
	// mismatch and stores nothing.
	err := x.Apply(part, r, &Event{Kind: Stored, BlockHashes: hashes, TokenIDs: []uint32{5, 6}, BlockSize: bs})
	if err == nil {
		t.Fatal("a million blocks over two tokens were accepted")
	}
	if !errors.Is(err, ErrTokenCount) || x.Counts().TokenCount != 1 {
		t.Fatalf("refused with %v, %d counted; want ErrTokenCount, counted once", err, x.Counts().TokenCount)
	}

	if got := x.Entries(); got != entries {
		t.Fatalf("entries %d, want %d", got, entries)
	}
	// The two blocks stored first still match in full.
	var m selection.Matches
	x.FindMatches(part, selection.AppendBlockHashes(nil, []uint32{1, 2, 3, 4}, bs, selection.HashOptions{}), &m)
	if len(m.List) != 1 || m.List[0].Tiers.Device != 2 {
		t.Fatalf("matches after the worst cases: %+v", m.List)
	}
}
