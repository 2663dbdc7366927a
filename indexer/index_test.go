package indexer

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

var part = selection.PartitionKey{Model: "m", Group: "g"}

// naiveIndex is the reference model: per rank, engine hash → the token
// prefix (as text) that block completes, with a reference count.
type naiveIndex struct {
	ranks map[selection.Rank]map[uint64]*naiveEntry
}

type naiveEntry struct {
	prefix string
	refs   int
}

func prefixText(tokens []uint32) string { return fmt.Sprint(tokens) }

// engineHash is a publisher's hash of a prefix: deterministic, like
// vLLM's, and unrelated to ours.
func engineHash(prefix []uint32) uint64 {
	h := fnv.New64a()
	fmt.Fprint(h, prefix)
	return h.Sum64()
}

func (m *naiveIndex) depth(r selection.Rank, prompt []uint32, bs int) uint32 {
	held := map[string]bool{}
	for _, e := range m.ranks[r] {
		held[e.prefix] = true
	}
	d := uint32(0)
	for end := bs; end <= len(prompt); end += bs {
		if !held[prefixText(prompt[:end])] {
			break
		}
		d++
	}
	return d
}

// TestIndexMatchesNaiveModel applies random stores (chunked, with
// parents, sometimes twice), removals and clears from several ranks, and
// checks every lookup against the naive model.
func TestIndexMatchesNaiveModel(t *testing.T) {
	const bs = 4
	rng := rand.New(rand.NewPCG(21, 22))
	x := New()
	x.ConfigurePartition(part, bs, false)
	ref := &naiveIndex{ranks: map[selection.Rank]map[uint64]*naiveEntry{}}
	bases := make([][]uint32, 3)
	for i := range bases {
		bases[i] = make([]uint32, 64)
		for j := range bases[i] {
			bases[i][j] = uint32(rng.IntN(50))
		}
	}
	ranks := []selection.Rank{{WorkerID: 1}, {WorkerID: 2}, {WorkerID: 2, DPRank: 1}, {WorkerID: 3}}
	for step := range 4000 {
		r := ranks[rng.IntN(len(ranks))]
		prompt := bases[rng.IntN(len(bases))]
		switch op := rng.IntN(10); {
		case op < 5: // store blocks [from, to) of a prompt, parent = block from-1
			from := rng.IntN(16)
			to := from + 1 + rng.IntN(16-from)
			ev := &Event{Kind: Stored, BlockSize: bs, TokenIDs: prompt[from*bs : to*bs]}
			if from > 0 {
				ev.ParentHash, ev.HasParent = engineHash(prompt[:from*bs]), true
			}
			for b := from; b < to; b++ {
				ev.BlockHashes = append(ev.BlockHashes, engineHash(prompt[:(b+1)*bs]))
			}
			err := x.Apply(part, r, ev)
			parentKnown := from == 0 || ref.ranks[r][ev.ParentHash] != nil
			if parentKnown != (err == nil) {
				t.Fatalf("step %d: store error %v, parent known %v", step, err, parentKnown)
			}
			if err != nil {
				continue
			}
			if ref.ranks[r] == nil {
				ref.ranks[r] = map[uint64]*naiveEntry{}
			}
			for b := from; b < to; b++ {
				h := engineHash(prompt[:(b+1)*bs])
				if e := ref.ranks[r][h]; e != nil {
					e.refs++
				} else {
					ref.ranks[r][h] = &naiveEntry{prefix: prefixText(prompt[:(b+1)*bs]), refs: 1}
				}
			}
		case op < 8: // remove one held hash
			var hs []uint64
			for h := range ref.ranks[r] {
				hs = append(hs, h)
			}
			if len(hs) == 0 {
				continue
			}
			h := hs[rng.IntN(len(hs))]
			if err := x.Apply(part, r, &Event{Kind: Removed, BlockHashes: []uint64{h}}); err != nil {
				t.Fatal(err)
			}
			e := ref.ranks[r][h]
			if e.refs--; e.refs == 0 {
				delete(ref.ranks[r], h)
			}
		case op < 9:
			if rng.IntN(5) == 0 {
				_ = x.Apply(part, r, &Event{Kind: Cleared})
				delete(ref.ranks, r)
			}
		default:
			if rng.IntN(10) == 0 {
				x.RemoveWorker(part, r.WorkerID)
				for rr := range ref.ranks {
					if rr.WorkerID == r.WorkerID {
						delete(ref.ranks, rr)
					}
				}
			}
		}
		// Look up a random prompt prefix.
		q := bases[rng.IntN(len(bases))][:min(64, bs*(1+rng.IntN(16))+rng.IntN(bs))]
		var m, mc selection.Matches
		qb := selection.AppendBlockHashes(nil, q, bs, selection.HashOptions{})
		x.FindMatches(part, qb, &m)
		x.FindMatchesChain(part, selection.AppendSequenceHashes(nil, qb), &mc)
		got := map[selection.Rank]uint32{}
		for _, e := range m.List {
			got[e.Rank] = e.Tiers.Device
		}
		if len(mc.List) != len(m.List) {
			t.Fatalf("step %d: chain lookup found %d ranks, block lookup %d", step, len(mc.List), len(m.List))
		}
		for _, e := range mc.List {
			if got[e.Rank] != e.Tiers.Device {
				t.Fatalf("step %d: chain lookup %v, block lookup %v", step, mc.List, m.List)
			}
		}
		for _, rr := range ranks {
			if want := ref.depth(rr, q, bs); got[rr] != want {
				t.Fatalf("step %d rank %v: depth %d, model %d", step, rr, got[rr], want)
			}
			if n := x.Blocks(part, rr); n != len(ref.ranks[rr]) {
				t.Fatalf("step %d rank %v: %d entries, model %d", step, rr, n, len(ref.ranks[rr]))
			}
		}
	}
	if x.Counts().UnknownParent == 0 {
		t.Fatal("the run never exercised an unknown parent")
	}
}

func TestIndexTiersAndDump(t *testing.T) {
	const bs = 2
	x := New()
	x.ConfigurePartition(part, bs, false)
	r := selection.Rank{WorkerID: 7}
	prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	store := func(from, to int, medium Tier) {
		ev := &Event{Kind: Stored, BlockSize: bs, TokenIDs: prompt[from*bs : to*bs], Tier: medium}
		if from > 0 {
			ev.ParentHash, ev.HasParent = engineHash(prompt[:from*bs]), true
		}
		for b := from; b < to; b++ {
			ev.BlockHashes = append(ev.BlockHashes, engineHash(prompt[:(b+1)*bs]))
		}
		if err := x.Apply(part, r, ev); err != nil {
			t.Fatal(err)
		}
	}
	store(0, 2, Device)
	store(2, 3, Host)
	store(3, 4, Disk)
	blocks := selection.AppendBlockHashes(nil, prompt, bs, selection.HashOptions{})
	var m selection.Matches
	x.FindMatches(part, blocks, &m)
	if len(m.List) != 1 || m.List[0].Tiers != (selection.Tiers{Device: 2, Host: 1, Disk: 1}) {
		t.Fatalf("tiers %+v", m.List)
	}
	// A dump replays into an equal index.
	dump := x.Dump(part)
	if len(dump) != 4 || dump[0].Event.Data.Stored.ParentHash != nil || dump[3].StorageTier != "disk" {
		t.Fatalf("dump %+v", dump)
	}
	y := New()
	y.ConfigurePartition(part, bs, false)
	if err := y.LoadDump(part, dump); err != nil {
		t.Fatal(err)
	}
	var m2 selection.Matches
	y.FindMatches(part, blocks, &m2)
	if len(m2.List) != 1 || m2.List[0] != m.List[0] || y.Blocks(part, r) != 4 {
		t.Fatalf("replayed %+v, want %+v", m2.List, m.List)
	}
	// Removing the engine's hash of block 2 ends the run there.
	if err := y.Apply(part, r, &Event{Kind: Removed, BlockHashes: []uint64{engineHash(prompt[:3*bs])}}); err != nil {
		t.Fatal(err)
	}
	m2.Reset()
	y.FindMatches(part, blocks, &m2)
	if m2.List[0].Tiers != (selection.Tiers{Device: 2}) {
		t.Fatalf("after removal %+v", m2.List)
	}
}

func TestIndexRechunksOtherBlockSizes(t *testing.T) {
	// The engine stores 2-token blocks; the partition hashes 4-token ones.
	x := New()
	x.ConfigurePartition(part, 4, false)
	r := selection.Rank{WorkerID: 1}
	prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	ev := &Event{Kind: Stored, BlockSize: 2, TokenIDs: prompt}
	for b := 0; b < 4; b++ {
		ev.BlockHashes = append(ev.BlockHashes, engineHash(prompt[:(b+1)*2]))
	}
	if err := x.Apply(part, r, ev); err != nil {
		t.Fatal(err)
	}
	var m selection.Matches
	x.FindMatches(part, selection.AppendBlockHashes(nil, prompt, 4, selection.HashOptions{}), &m)
	if len(m.List) != 1 || m.List[0].Tiers.Device != 2 {
		t.Fatalf("rechunked match %+v", m.List)
	}
}

// TestIndexConcurrentIngestAndLookup runs one writer per rank (events of a
// rank are applied in order, as listeners do) against concurrent lookups.
func TestIndexConcurrentIngestAndLookup(t *testing.T) {
	const bs = 4
	x := New()
	x.ConfigurePartition(part, bs, false)
	prompt := make([]uint32, 256)
	for i := range prompt {
		prompt[i] = uint32(i)
	}
	blocks := selection.AppendBlockHashes(nil, prompt, bs, selection.HashOptions{})
	done := make(chan struct{})
	errs := make(chan error, 8)
	for w := range 4 {
		go func() {
			r := selection.Rank{WorkerID: uint64(w)}
			for range 200 {
				ev := &Event{Kind: Stored, BlockSize: bs, TokenIDs: prompt}
				for b := range len(prompt) / bs {
					ev.BlockHashes = append(ev.BlockHashes, engineHash(prompt[:(b+1)*bs]))
				}
				if err := x.Apply(part, r, ev); err != nil {
					errs <- err
					return
				}
				if err := x.Apply(part, r, &Event{Kind: Cleared}); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	go func() {
		defer close(done)
		for range 500 {
			var m selection.Matches
			x.FindMatches(part, blocks, &m)
			for _, e := range m.List {
				if e.Tiers.Device != 0 && e.Tiers.Device != uint32(len(blocks)) {
					// A store is applied whole under the lock: a lookup
					// sees all of it or none.
					errs <- fmt.Errorf("torn store seen: depth %d", e.Tiers.Device)
					return
				}
			}
		}
	}()
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	<-done
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
}

func TestIndexLargerEngineBlocksAndCap(t *testing.T) {
	// The engine stores 8-token blocks; the partition hashes 4-token ones:
	// each engine block covers two of ours, and removing it drops both.
	x := New()
	x.ConfigurePartition(part, 4, false)
	r := selection.Rank{WorkerID: 1}
	prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	ev := &Event{Kind: Stored, BlockSize: 8, TokenIDs: prompt,
		BlockHashes: []uint64{engineHash(prompt[:8]), engineHash(prompt)}}
	if err := x.Apply(part, r, ev); err != nil {
		t.Fatal(err)
	}
	blocks := selection.AppendBlockHashes(nil, prompt, 4, selection.HashOptions{})
	depth := func() uint32 {
		var m selection.Matches
		x.FindMatches(part, blocks, &m)
		if len(m.List) == 0 {
			return 0
		}
		return m.List[0].Tiers.Device
	}
	if d := depth(); d != 4 {
		t.Fatalf("depth %d, want 4", d)
	}
	if err := x.Apply(part, r, &Event{Kind: Removed, BlockHashes: []uint64{engineHash(prompt)}}); err != nil {
		t.Fatal(err)
	}
	if d := depth(); d != 2 {
		t.Fatalf("depth %d after removing the second engine block, want 2", d)
	}
	x.RemoveRank(part, r)
	if x.Entries() != 0 || x.tree(part).nodes.Len() != 0 {
		t.Fatalf("%d entries, %d nodes left", x.Entries(), x.tree(part).nodes.Len())
	}

	// At the cap, new blocks are stored and the oldest evicted, counted,
	// leaving no empty nodes.
	x.MaxEntries = 1
	ev = &Event{Kind: Stored, BlockSize: 4, TokenIDs: prompt[:12],
		BlockHashes: []uint64{engineHash(prompt[:4]), engineHash(prompt[:8]), engineHash(prompt[:12])}}
	if err := x.Apply(part, r, ev); err != nil {
		t.Fatal(err)
	}
	if x.Entries() != 1 || x.Counts().Full != 2 || x.Counts().Evicted != 2 || x.tree(part).nodes.Len() != 1 {
		t.Fatalf("entries %d full %d evicted %d nodes %d", x.Entries(), x.Counts().Full, x.Counts().Evicted, x.tree(part).nodes.Len())
	}
}
