package indexer

import (
	"math/rand/v2"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestIndexModelThroughRebuilds checks the record layout where the small
// model test cannot reach: enough blocks, shared by enough ranks, that
// removing most of them makes tidy move the live records and further
// holders to fresh pages (rebuildRecords, rebuildExts) and renumber every
// table, parent, set and queue item. Lookups, entry counts and a dump
// replayed into a fresh index must agree with the naive model before, in
// the middle of and after the removals, and after storing again; with a
// bound (the queue holds refs) and without.
func TestIndexModelThroughRebuilds(t *testing.T) {
	for _, bounded := range []bool{false, true} {
		name := map[bool]string{false: "unbounded", true: "bounded"}[bounded]
		t.Run(name, func(t *testing.T) { modelThroughRebuilds(t, bounded) })
	}
}

func modelThroughRebuilds(t *testing.T, bounded bool) {
	const bs, nBases, baseBlocks = 4, 128, 64
	rng := rand.New(rand.NewPCG(31, 32))
	x := New()
	if bounded {
		x.MaxEntries = 1 << 30 // queued, never evicted
	}
	x.ConfigurePartition(part, bs, false)
	ref := &naiveIndex{ranks: map[selection.Rank]map[uint64]*naiveEntry{}}
	bases := make([][]uint32, nBases)
	for i := range bases {
		bases[i] = make([]uint32, baseBlocks*bs)
		for j := range bases[i] {
			bases[i][j] = uint32(rng.IntN(1 << 20))
		}
	}
	prefixHashes := make([][]uint64, nBases) // engine hashes of each base's prefixes
	for i, prompt := range bases {
		for b := range baseBlocks {
			prefixHashes[i] = append(prefixHashes[i], engineHash(prompt[:(b+1)*bs]))
		}
	}
	ranks := make([]selection.Rank, 8)
	for i := range ranks {
		ranks[i] = selection.Rank{WorkerID: uint64(i / 2), DPRank: uint32(i % 2)}
	}
	store := func(r selection.Rank, prompt []uint32, to int, tier Tier) {
		ev := &Event{Kind: Stored, BlockSize: bs, TokenIDs: prompt[:to*bs], Tier: tier}
		for b := range to {
			ev.BlockHashes = append(ev.BlockHashes, engineHash(prompt[:(b+1)*bs]))
		}
		if err := x.Apply(part, r, ev); err != nil {
			t.Fatal(err)
		}
		if ref.ranks[r] == nil {
			ref.ranks[r] = map[uint64]*naiveEntry{}
		}
		for b := range to {
			h := engineHash(prompt[:(b+1)*bs])
			if e := ref.ranks[r][h]; e != nil {
				e.refs++
			} else {
				ref.ranks[r][h] = &naiveEntry{prefix: prefixText(prompt[:(b+1)*bs]), refs: 1}
			}
		}
	}
	remove := func(r selection.Rank, h uint64) {
		if err := x.Apply(part, r, &Event{Kind: Removed, BlockHashes: []uint64{h}}); err != nil {
			t.Fatal(err)
		}
		e := ref.ranks[r][h]
		if e.refs--; e.refs == 0 {
			delete(ref.ranks[r], h)
		}
	}
	check := func(when string, idx *Index, counts bool) {
		t.Helper()
		for p, prompt := range bases {
			var m selection.Matches
			qb := selection.AppendBlockHashes(nil, prompt, bs, selection.HashOptions{})
			idx.FindMatches(part, qb, &m)
			got := map[selection.Rank]uint32{}
			for _, e := range m.List {
				got[e.Rank] = e.Tiers.Device + e.Tiers.Host // each rank stores in one tier per base
			}
			for _, r := range ranks {
				want := uint32(0) // the model's depth: how many leading prefixes the rank holds
				for _, h := range prefixHashes[p] {
					if ref.ranks[r][h] == nil {
						break
					}
					want++
				}
				if got[r] != want {
					t.Fatalf("%s: rank %v depth %d, model %d", when, r, got[r], want)
				}
			}
		}
		for _, r := range ranks {
			if n := idx.Blocks(part, r); counts && n != len(ref.ranks[r]) {
				t.Fatalf("%s: rank %v holds %d entries, model %d", when, r, n, len(ref.ranks[r]))
			}
		}
	}
	// Every rank stores a random prefix of most bases, in the host tier
	// for some, so most blocks are shared by several ranks.
	for _, r := range ranks {
		for i, prompt := range bases {
			if rng.IntN(8) != 0 {
				store(r, prompt, 1+rng.IntN(baseBlocks), Tier(i%2))
			}
		}
	}
	check("stored", x, true)
	tr := x.tree(part)
	recPeak, extPeak := tr.recs.peak, tr.exts.peak
	if recPeak < rebuildMin || extPeak < rebuildMin {
		t.Fatalf("%d records, %d further holders: too few to rebuild", recPeak, extPeak)
	}
	// Remove all but a fiftieth of the entries, in random order: most
	// blocks lose every holder.
	var all []struct {
		r selection.Rank
		h uint64
	}
	for _, r := range ranks {
		for h, e := range ref.ranks[r] {
			for range e.refs {
				all = append(all, struct {
					r selection.Rank
					h uint64
				}{r, h})
			}
		}
	}
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	for i, rh := range all[:len(all)*49/50] {
		remove(rh.r, rh.h)
		if i == len(all)/2 {
			check("half removed", x, true)
		}
	}
	check("most removed", x, true)
	if tr.recs.peak >= recPeak || tr.exts.peak >= extPeak {
		t.Fatalf("records peak %d→%d, further holders %d→%d: no rebuild", recPeak, tr.recs.peak, extPeak, tr.exts.peak)
	}
	y := New()
	y.ConfigurePartition(part, bs, false)
	if err := y.LoadDump(part, x.Dump(part)); err != nil {
		t.Fatal(err)
	}
	check("dump of what is left", y, false) // a dump leaves out blocks whose parent the rank lost
	// Store again over what is left.
	for _, r := range ranks[:4] {
		for i, prompt := range bases[:nBases/2] {
			store(r, prompt, baseBlocks, Tier(i%2))
		}
	}
	check("stored again", x, true)
	for _, r := range ranks {
		_ = x.Apply(part, r, &Event{Kind: Cleared})
		delete(ref.ranks, r)
	}
	check("cleared", x, true)
	if x.Entries() != 0 || tr.recs.used != 0 || tr.exts.used != 0 || tr.queued() != 0 {
		t.Fatalf("cleared: %d entries, %d records, %d further holders, %d queued",
			x.Entries(), tr.recs.used, tr.exts.used, tr.queued())
	}
}

// TestIndexRefusesWhatRecordsCannotHold: an engine block spanning more of
// our blocks than an entry counts (maxSpan), and a store that would take
// a partition past the records its refs can name, are refused whole.
func TestIndexRefusesWhatRecordsCannotHold(t *testing.T) {
	const bs = 4
	x := New()
	x.ConfigurePartition(part, bs, false)
	r := selection.Rank{WorkerID: 1}
	huge := &Event{Kind: Stored, BlockSize: (maxSpan + 1) * bs, TokenIDs: make([]uint32, (maxSpan+1)*bs),
		BlockHashes: []uint64{1}}
	if err := x.Apply(part, r, huge); err != ErrBlockSpan {
		t.Fatalf("a %d-token engine block: %v", huge.BlockSize, err)
	}
	tr := x.tree(part)
	tr.recs.next = maxIndex - 1 // room for two more records
	ev := &Event{Kind: Stored, BlockSize: bs, TokenIDs: make([]uint32, 4*bs), BlockHashes: []uint64{1, 2, 3, 4}}
	if err := x.Apply(part, r, ev); err != ErrPartitionFull {
		t.Fatalf("four blocks with room for two: %v", err)
	}
	if x.Entries() != 0 || tr.nodes.Len() != 0 {
		t.Fatalf("%d entries, %d blocks after refusals", x.Entries(), tr.nodes.Len())
	}
}
