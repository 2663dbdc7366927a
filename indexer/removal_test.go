package indexer

import (
	"math/rand/v2"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestRemovalEventsMatchModel applies removal events of many hashes at
// once (more than one read-ahead chunk, aheadMax, with the same hash
// listed twice or more, and hashes the rank never held) between stores
// of whole prompts, some stored twice, and checks every rank's entries,
// the unknown-block count and lookups against the naive model. The
// read-ahead finds each entry before any of the event's removals runs;
// a repeated hash must still drop one reference per listing, and a
// listing past the last reference must count as unknown.
func TestRemovalEventsMatchModel(t *testing.T) {
	const bs = 4
	rng := rand.New(rand.NewPCG(41, 42))
	x := New()
	x.ConfigurePartition(part, bs, false)
	ref := &naiveIndex{ranks: map[selection.Rank]map[uint64]*naiveEntry{}}
	prompts := make([][]uint32, 6)
	for i := range prompts {
		prompts[i] = make([]uint32, 200*bs)
		for j := range prompts[i] {
			prompts[i][j] = uint32(rng.IntN(1000))
		}
	}
	ranks := []selection.Rank{{WorkerID: 1}, {WorkerID: 2}, {WorkerID: 2, DPRank: 1}}
	var unknown uint64
	for step := range 600 {
		r := ranks[rng.IntN(len(ranks))]
		if rng.IntN(3) > 0 { // store a prompt's first blocks, from the root
			p := prompts[rng.IntN(len(prompts))]
			n := 1 + rng.IntN(200)
			ev := &Event{Kind: Stored, BlockSize: bs, TokenIDs: p[:n*bs]}
			for b := range n {
				ev.BlockHashes = append(ev.BlockHashes, engineHash(p[:(b+1)*bs]))
			}
			if err := x.Apply(part, r, ev); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			if ref.ranks[r] == nil {
				ref.ranks[r] = map[uint64]*naiveEntry{}
			}
			for b := range n {
				h := ev.BlockHashes[b]
				if e := ref.ranks[r][h]; e != nil {
					e.refs++
				} else {
					ref.ranks[r][h] = &naiveEntry{prefix: prefixText(p[:(b+1)*bs]), refs: 1}
				}
			}
		} else { // remove many hashes at once: held ones, repeats, unknown ones
			var held []uint64
			for h := range ref.ranks[r] {
				held = append(held, h)
			}
			var hs []uint64
			for range rng.IntN(3 * aheadMax) {
				switch k := rng.IntN(10); {
				case k < 7 && len(held) > 0:
					hs = append(hs, held[rng.IntN(len(held))])
				case k < 9 && len(hs) > 0:
					hs = append(hs, hs[rng.IntN(len(hs))])
				default:
					hs = append(hs, rng.Uint64())
				}
			}
			if err := x.Apply(part, r, &Event{Kind: Removed, BlockHashes: hs}); err != nil {
				t.Fatal(err)
			}
			for _, h := range hs {
				e := ref.ranks[r][h]
				if e == nil {
					unknown++
					continue
				}
				if e.refs--; e.refs == 0 {
					delete(ref.ranks[r], h)
				}
			}
		}
		if got := x.Counts().UnknownBlock; got != unknown {
			t.Fatalf("step %d: %d unknown blocks counted, model %d", step, got, unknown)
		}
		total := 0
		for _, rr := range ranks {
			if n := x.Blocks(part, rr); n != len(ref.ranks[rr]) {
				t.Fatalf("step %d rank %v: %d entries, model %d", step, rr, n, len(ref.ranks[rr]))
			}
			total += len(ref.ranks[rr])
		}
		if got := x.Entries(); got != int64(total) {
			t.Fatalf("step %d: index counts %d entries, model %d", step, got, total)
		}
		q := prompts[rng.IntN(len(prompts))]
		var m selection.Matches
		x.FindMatches(part, selection.AppendBlockHashes(nil, q, bs, selection.HashOptions{}), &m)
		got := map[selection.Rank]uint32{}
		for _, e := range m.List {
			got[e.Rank] = e.Tiers.Device
		}
		for _, rr := range ranks {
			if want := ref.depth(rr, q, bs); got[rr] != want {
				t.Fatalf("step %d rank %v: depth %d, model %d", step, rr, got[rr], want)
			}
		}
	}
	if unknown == 0 {
		t.Fatal("the run never removed an unknown hash")
	}
}
