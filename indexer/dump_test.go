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

// TestDumpBoundsItsWalk: a capped dump of blocks none of which can be
// replayed (each chain's first block removed) stops after
// dumpVisitsPerEvent such records per event allowed, truncated, where it
// used to walk them all and answer "complete, empty"; an uncapped one
// still walks them all. A healthy partition is untouched by the bound,
// even with a cap of one event over chains of 200 blocks (the first
// event needs its chain's ancestors walked).
func TestDumpBoundsItsWalk(t *testing.T) {
	const bs, chains, blocks = 2, 20, 200
	x := New()
	x.ConfigurePartition(part, bs, false)
	r := selection.Rank{WorkerID: 1}
	for c := range chains {
		ev := &Event{Kind: Stored, BlockSize: bs}
		for k := range blocks {
			ev.TokenIDs = append(ev.TokenIDs, uint32(c*1000+2*k), uint32(c*1000+2*k+1))
			ev.BlockHashes = append(ev.BlockHashes, uint64(c)<<32|uint64(k))
		}
		if err := x.Apply(part, r, ev); err != nil {
			t.Fatal(err)
		}
	}
	// Healthy: every block dumps; a cap cuts by events, not by the walk.
	if events, truncated := x.DumpLimit(part, chains*blocks); len(events) != chains*blocks || truncated {
		t.Fatalf("healthy, capped at the total: %d events, truncated %v", len(events), truncated)
	}
	if events, truncated := x.DumpLimit(part, 1); len(events) != 1 || !truncated {
		t.Fatalf("healthy, capped at one event: %d events, truncated %v", len(events), truncated)
	}
	for c := range chains {
		if err := x.Apply(part, r, &Event{Kind: Removed, BlockHashes: []uint64{uint64(c) << 32}}); err != nil {
			t.Fatal(err)
		}
	}
	if events, truncated := x.DumpLimit(part, 0); len(events) != 0 || truncated {
		t.Fatalf("orphans, uncapped: %d events, truncated %v; want none, complete", len(events), truncated)
	}
	if events, truncated := x.DumpLimit(part, 10); len(events) != 0 || !truncated {
		t.Fatalf("orphans, capped at 10 events: %d events, truncated %v; want none, truncated after %d visits",
			len(events), truncated, dumpVisitsPerEvent*10)
	}
}
