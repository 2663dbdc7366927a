package indexer

import (
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestLookupDuringIngest runs lookups of a 1,000-block prompt (letting
// events in at every look at the clock, lookupYield, so that each walk
// lets them in several times) while other goroutines
// store the same prompt for ranks that did not exist when the lookups
// began and remove it again. Every answer must name only ranks holding
// the prompt's first block and never more blocks than the prompt has; a
// rank numbered past the lookup's slots must not crash it. Run it with
// -race.
func TestLookupDuringIngest(t *testing.T) {
	const bs, blocks = 4, 1000
	x := New()
	x.lookupHold = 0
	x.ConfigurePartition(part, bs, false)
	tokens := make([]uint32, blocks*bs)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	engine := make([]uint64, blocks)
	for i := range engine {
		engine[i] = uint64(i + 1)
	}
	store := func(r selection.Rank) {
		if err := x.Apply(part, r, &Event{Kind: Stored, BlockSize: bs, TokenIDs: tokens, BlockHashes: engine}); err != nil {
			t.Error(err)
		}
	}
	for w := range 4 {
		store(selection.Rank{WorkerID: uint64(w)})
	}
	prompt := selection.AppendBlockHashes(nil, tokens, bs, selection.HashOptions{})
	deadline := time.Now().Add(500 * time.Millisecond)
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Go(func() {
			for w := 0; time.Now().Before(deadline); w++ {
				r := selection.Rank{WorkerID: uint64(1000 + g*1_000_000 + w)}
				store(r)
				_ = x.Apply(part, r, &Event{Kind: Removed, BlockHashes: engine[blocks/2:]})
				if w%2 == 0 {
					x.RemoveRank(part, r)
				}
			}
		})
	}
	lookups := 0
	for ; time.Now().Before(deadline); lookups++ {
		var m selection.Matches
		x.FindMatches(part, prompt, &m)
		if len(m.List) < 4 {
			t.Fatalf("%d ranks matched, want at least the 4 that hold the prompt throughout", len(m.List))
		}
		for _, match := range m.List {
			if d := match.Tiers.Device; d == 0 || d > blocks {
				t.Fatalf("rank %v matched %d blocks of %d", match.Rank, d, blocks)
			}
		}
	}
	wg.Wait()
	if lookups == 0 {
		t.Fatal("no lookup ran")
	}
}
