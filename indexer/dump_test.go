package indexer

import (
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestIndexDumpLimit: a bounded dump returns at most limit events, says
// whether more existed, and keeps parents before children, so every
// prefix of it loads into a fresh index without an unknown parent; an
// unbounded one rebuilds the whole index.
func TestIndexDumpLimit(t *testing.T) {
	const bs = 2
	x := New()
	x.ConfigurePartition(part, bs, false)
	shared := []uint32{1, 2, 3, 4, 5, 6}
	for w := range 3 {
		r := selection.Rank{WorkerID: uint64(w + 1)}
		for v := range 2 {
			prompt := append(append([]uint32{}, shared...), uint32(100*w+10*v), 7, uint32(v), 9)
			ev := &Event{Kind: Stored, BlockSize: bs, TokenIDs: prompt}
			for b := range len(prompt) / bs {
				ev.BlockHashes = append(ev.BlockHashes, engineHash(prompt[:(b+1)*bs]))
			}
			if err := x.Apply(part, r, ev); err != nil {
				t.Fatal(err)
			}
		}
	}
	total := int(x.Entries())
	if n := len(x.Dump(part)); n != total {
		t.Fatalf("Dump gave %d events for %d entries", n, total)
	}
	for _, tc := range []struct {
		limit         int
		want          int
		wantTruncated bool
	}{
		{0, total, false},
		{-1, total, false},
		{total, total, false},
		{total + 1, total, false},
		{1, 1, true},
		{5, 5, true},
		{total - 1, total - 1, true},
	} {
		events, truncated := x.DumpLimit(part, tc.limit)
		if len(events) != tc.want || truncated != tc.wantTruncated {
			t.Errorf("limit %d: %d events, truncated %v; want %d, %v", tc.limit, len(events), truncated, tc.want, tc.wantTruncated)
			continue
		}
		y := New()
		y.ConfigurePartition(part, bs, false)
		if err := y.LoadDump(part, events); err != nil {
			t.Fatal(err)
		}
		if y.Counts().UnknownParent != 0 || int(y.Entries()) != len(events) {
			t.Errorf("limit %d: loading gave %d unknown parents and %d entries for %d events",
				tc.limit, y.Counts().UnknownParent, y.Entries(), len(events))
		}
	}
	if _, truncated := New().DumpLimit(part, 1); truncated {
		t.Error("a partition that does not exist was truncated")
	}
}
