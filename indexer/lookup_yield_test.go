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

// TestLookupFindsAgainAfterItsGap: a lookup finds a window of blocks at
// once (resolve) and lets events in every lookupYield blocks. Here rank 1
// holds a 1,000-block prompt, and in the lookup's first gap (at block 128)
// it removes blocks 128 on and stores another chain, whose records are
// the ones just freed. The lookup must find the rest of its window
// again rather than trust what it found before the gap, which now names
// the other chain's blocks (held by rank 1 too): the answer is 128
// blocks, where the stale finds made it 160, the window's end.
func TestLookupFindsAgainAfterItsGap(t *testing.T) {
	const bs, blocks = 4, 1000
	x := New()
	x.lookupHold = 0
	x.ConfigurePartition(part, bs, false)
	r := selection.Rank{WorkerID: 1}
	chain := func(first uint32, engineBase uint64) *Event {
		ev := &Event{Kind: Stored, BlockSize: bs, TokenIDs: make([]uint32, blocks*bs), BlockHashes: make([]uint64, blocks)}
		for i := range ev.TokenIDs {
			ev.TokenIDs[i] = first + uint32(i)
		}
		for i := range ev.BlockHashes {
			ev.BlockHashes[i] = engineBase + uint64(i)
		}
		return ev
	}
	prompt := chain(0, 1)
	if err := x.Apply(part, r, prompt); err != nil {
		t.Fatal(err)
	}
	gaps := 0
	x.lookupGap = func() {
		if gaps++; gaps > 1 {
			return
		}
		rm := &Event{Kind: Removed, BlockHashes: prompt.BlockHashes[128:]}
		if err := x.Apply(part, r, rm); err != nil {
			t.Error(err)
		}
		other := chain(1<<20, 1<<32)
		other.TokenIDs = other.TokenIDs[:(blocks-128)*bs]
		other.BlockHashes = other.BlockHashes[:blocks-128]
		if err := x.Apply(part, r, other); err != nil {
			t.Error(err)
		}
	}
	var m selection.Matches
	x.FindMatches(part, selection.AppendBlockHashes(nil, prompt.TokenIDs, bs, selection.HashOptions{}), &m)
	if gaps == 0 {
		t.Fatal("the lookup never let an event in")
	}
	if len(m.List) != 1 || m.List[0].Tiers.Device != 128 {
		t.Fatalf("matches %+v; want rank 1 with 128 blocks", m.List)
	}
}
