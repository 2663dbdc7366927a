package indexer

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestGrowAsideUnderLookups: with every table growing aside (growAsideMin
// 2), four publishers store and remove prompts while two goroutines look
// up a prompt stored first and never removed (run under -race in CI). The
// lookups always find it whole, and at the end no table is over its load
// bound or still waiting to grow, and every prompt still held is found.
func TestGrowAsideUnderLookups(t *testing.T) {
	defer func(was int) { growAsideMin = was }(growAsideMin)
	growAsideMin = 2
	x := New()
	x.ConfigurePartition(part, ebs, false)
	anchor := selection.Rank{WorkerID: 99}
	storeAll(t, x, part, anchor, evictPrompt(99_999, 8))
	var stop atomic.Bool
	var lookups sync.WaitGroup
	for range 2 {
		lookups.Go(func() {
			for !stop.Load() {
				if d := depthOf(x, part, anchor, evictPrompt(99_999, 8)); d != 8 {
					t.Errorf("the anchor prompt matched %d blocks", d)
					return
				}
			}
		})
	}
	var writers sync.WaitGroup
	for w := range 4 {
		r := selection.Rank{WorkerID: uint64(w)}
		writers.Go(func() {
			for i := range uint32(600) {
				storeAll(t, x, part, r, evictPrompt(uint32(w)*10_000+i, 6))
				if i%3 == 2 {
					removeAll(t, x, part, r, evictPrompt(uint32(w)*10_000+i-2, 6))
				}
			}
		})
	}
	writers.Wait()
	stop.Store(true)
	lookups.Wait()
	tr := x.tree(part)
	tables := []*refTable{tr.nodes}
	for _, m := range tr.ranks {
		tables = append(tables, m)
	}
	for _, tab := range tables {
		if tab.growing || tab.Len() > capacityOf(len(tab.buckets)) {
			t.Fatalf("a table of %d keys in %d buckets, waiting to grow: %v", tab.Len(), len(tab.buckets), tab.growing)
		}
	}
	for w := range 4 {
		r := selection.Rank{WorkerID: uint64(w)}
		for i := range uint32(600) {
			want := uint32(6)
			if i%3 == 0 {
				want = 0
			}
			if d := depthOf(x, part, r, evictPrompt(uint32(w)*10_000+i, 6)); d != want {
				t.Fatalf("rank %d prompt %d: %d blocks, want %d", w, i, d, want)
			}
		}
	}
}
