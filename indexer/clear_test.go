package indexer

import (
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestClearDropsAChunkAtATime: a cleared rank holds nothing from the
// moment it is detached, its entries leave a chunk per call of clearSome
// with the lock free in between, other ranks are untouched throughout, and
// what the rank stores again while the drain runs (an engine restarted
// and prefilling) outlives it. At the end the tree keeps nothing of the
// old entries: no entry, record or queue item.
func TestClearDropsAChunkAtATime(t *testing.T) {
	const prompts, blocks = 40, 16
	for _, bound := range []int64{0, 1 << 20} { // without and with eviction queues
		x := New()
		x.MaxEntries = bound
		x.ConfigurePartition(part, ebs, false)
		cleared, other := selection.Rank{WorkerID: 1}, selection.Rank{WorkerID: 2}
		for i := range uint32(prompts) {
			storeAll(t, x, part, cleared, evictPrompt(i, blocks))
			storeAll(t, x, part, other, evictPrompt(1000+i, blocks))
		}
		storeAll(t, x, part, other, evictPrompt(0, blocks)) // a block both hold
		tr := x.tree(part)
		tr.mu.Lock()
		tr.detachRank(x, cleared)
		tr.mu.Unlock()
		if n := x.Blocks(part, cleared); n != 0 {
			t.Fatalf("bound %d: the detached rank still counts %d blocks", bound, n)
		}
		// The engine stores its first prompt again mid-drain.
		restored := false
		before := x.Entries()
		chunks := 0
		for {
			tr.mu.Lock()
			left := tr.clearSome(x, 64)
			tr.mu.Unlock()
			chunks++
			if now := x.Entries(); now > before {
				t.Fatalf("bound %d: entries grew from %d to %d during the drain", bound, before, now)
			} else {
				before = now
			}
			if d := depthOf(x, part, other, evictPrompt(1000+uint32(chunks%prompts), blocks)); d != blocks {
				t.Fatalf("bound %d, chunk %d: the other rank's prompt matched %d blocks", bound, chunks, d)
			}
			if !restored && chunks == 3 {
				storeAll(t, x, part, cleared, evictPrompt(0, blocks))
				restored, before = true, before+blocks
			}
			if !left {
				break
			}
		}
		least := prompts * blocks / 75 // a chunk of 64 drops at most 64 + 11 (a bucket's slots, less one)
		if bound > 0 {
			least += prompts * blocks / 64 // and as many again for the queue items
		}
		if chunks < least {
			t.Fatalf("bound %d: %d entries dropped in %d chunks of 64", bound, prompts*blocks, chunks)
		}
		if d := depthOf(x, part, cleared, evictPrompt(0, blocks)); d != blocks {
			t.Errorf("bound %d: the prompt stored again mid-drain matched %d blocks, want %d", bound, d, blocks)
		}
		if d := depthOf(x, part, cleared, evictPrompt(1, blocks)); d != 0 {
			t.Errorf("bound %d: a cleared prompt still matches %d blocks", bound, d)
		}
		if got, want := x.Entries(), int64((prompts+2)*blocks); got != want || x.Blocks(part, cleared) != blocks {
			t.Errorf("bound %d: %d entries (%d of the cleared rank), want %d", bound, got, x.Blocks(part, cleared), want)
		}
		// Clearing both ranks for good leaves nothing behind.
		for _, r := range []selection.Rank{cleared, other} {
			if err := x.Apply(part, r, &Event{Kind: Cleared}); err != nil {
				t.Fatal(err)
			}
		}
		if x.Entries() != 0 || tr.recs.used != 0 || tr.exts.used != 0 || tr.queued() != 0 || tr.clears != nil || tr.live != 0 {
			t.Fatalf("bound %d: all cleared: %d entries, %d records, %d further holders, %d queued, %d clears pending",
				bound, x.Entries(), tr.recs.used, tr.exts.used, tr.queued(), len(tr.clears))
		}
	}
}

// TestClearLeavesTablesAloneWhileDraining: a tidy that runs while a
// detached rank is still to be dropped moves no record (rebuilding
// records renumbers refs, and the detached table names them), even when
// the tree has fallen far below its peak, which would otherwise rebuild.
func TestClearLeavesTablesAloneWhileDraining(t *testing.T) {
	x := New()
	x.ConfigurePartition(part, ebs, false)
	big, small := selection.Rank{WorkerID: 1}, selection.Rank{WorkerID: 2}
	for i := range uint32(400) {
		storeAll(t, x, part, big, evictPrompt(i, 16))
	}
	storeAll(t, x, part, small, evictPrompt(5000, 16))
	tr := x.tree(part)
	tr.mu.Lock()
	tr.detachRank(x, big)
	tr.clearSome(x, 6000) // most of it: records fall below a quarter of their peak
	pages := tr.recs.pages
	tr.tidy()
	moved := &tr.recs.pages[0] != &pages[0]
	tr.mu.Unlock()
	if moved {
		t.Fatal("a tidy moved the records while a detached rank still named them")
	}
	x.drainClears(tr)
	if d := depthOf(x, part, small, evictPrompt(5000, 16)); d != 16 || x.Entries() != 16 {
		t.Fatalf("after the drain: the other rank matches %d blocks, %d entries", d, x.Entries())
	}
}
