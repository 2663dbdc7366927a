package indexer

import (
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

const ebs = 2 // block size of the eviction tests

// evictPrompt is a prompt of n blocks unique to salt.
func evictPrompt(salt uint32, n int) []uint32 {
	p := make([]uint32, n*ebs)
	for i := range p {
		p[i] = salt*1000 + uint32(i)
	}
	return p
}

func storeAll(t *testing.T, x *Index, p selection.PartitionKey, r selection.Rank, prompt []uint32) {
	t.Helper()
	ev := &Event{Kind: Stored, BlockSize: ebs, TokenIDs: prompt}
	for b := range len(prompt) / ebs {
		ev.BlockHashes = append(ev.BlockHashes, engineHash(prompt[:(b+1)*ebs]))
	}
	if err := x.Apply(p, r, ev); err != nil {
		t.Fatal(err)
	}
}

func removeAll(t *testing.T, x *Index, p selection.PartitionKey, r selection.Rank, prompt []uint32) {
	t.Helper()
	ev := &Event{Kind: Removed}
	for b := range len(prompt) / ebs {
		ev.BlockHashes = append(ev.BlockHashes, engineHash(prompt[:(b+1)*ebs]))
	}
	if err := x.Apply(p, r, ev); err != nil {
		t.Fatal(err)
	}
}

func depthOf(x *Index, p selection.PartitionKey, r selection.Rank, prompt []uint32) uint32 {
	return depthAt(x, p, ebs, r, prompt)
}

// depthAt is how many of prompt's blocks of size bs rank r holds in
// partition p of x.
func depthAt(x *Index, p selection.PartitionKey, bs int, r selection.Rank, prompt []uint32) uint32 {
	var m selection.Matches
	x.FindMatches(p, selection.AppendBlockHashes(nil, prompt, bs, selection.HashOptions{}), &m)
	for _, e := range m.List {
		if e.Rank == r {
			return e.Tiers.Device
		}
	}
	return 0
}

// TestIndexEvictsOldest: with MaxEntries 10, stores of 5-block prompts go
// in whatever the index holds and evict the oldest entries, across
// partitions and ranks. A prompt looked up since it was stored is spared
// once; entries removed by the engine leave stale queue items that evict
// nothing; a prompt removed and stored again counts from its new store,
// not its first.
func TestIndexEvictsOldest(t *testing.T) {
	other := selection.PartitionKey{Model: "m2", Group: "g"}
	r1, r2 := selection.Rank{WorkerID: 1}, selection.Rank{WorkerID: 2}
	type step struct {
		op     string // "store", "remove" or "lookup"
		p      selection.PartitionKey
		r      selection.Rank
		prompt uint32
	}
	for _, tc := range []struct {
		name    string
		steps   []step
		kept    []uint32 // prompts held in full at the end
		evicted uint64
	}{
		{"one partition", []step{
			{"store", part, r1, 1}, {"store", part, r1, 2}, {"store", part, r2, 3},
		}, []uint32{2, 3}, 5},
		{"across partitions", []step{
			{"store", other, r1, 1}, {"store", part, r1, 2}, {"store", other, r2, 3},
		}, []uint32{2, 3}, 5},
		{"removed entries are not evicted twice", []step{
			{"store", part, r1, 1}, {"remove", part, r1, 1}, {"store", part, r1, 2}, {"store", part, r1, 3},
		}, []uint32{2, 3}, 0},
		{"a looked-up prompt gets a second turn", []step{
			{"store", part, r1, 1}, {"store", part, r2, 2}, {"lookup", part, r1, 1}, {"store", part, r1, 3},
		}, []uint32{1, 3}, 5},
		{"a re-stored prompt counts from its new store", []step{
			{"store", part, r1, 1}, {"remove", part, r1, 1}, {"store", part, r1, 2},
			{"store", part, r1, 1}, {"store", part, r1, 3},
		}, []uint32{1, 3}, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := New()
			x.MaxEntries = 10
			x.ConfigurePartition(part, ebs, false)
			x.ConfigurePartition(other, ebs, false)
			where := map[uint32]step{}
			for _, s := range tc.steps {
				switch s.op {
				case "store":
					storeAll(t, x, s.p, s.r, evictPrompt(s.prompt, 5))
					where[s.prompt] = s
				case "remove":
					removeAll(t, x, s.p, s.r, evictPrompt(s.prompt, 5))
				default:
					depthOf(x, s.p, s.r, evictPrompt(s.prompt, 5))
				}
			}
			if x.Entries() > x.MaxEntries || x.Counts().Evicted != tc.evicted {
				t.Fatalf("entries %d evicted %d; want at most %d entries, %d evicted", x.Entries(), x.Counts().Evicted, x.MaxEntries, tc.evicted)
			}
			for salt, s := range where {
				want := uint32(0)
				for _, k := range tc.kept {
					if k == salt {
						want = 5
					}
				}
				if d := depthOf(x, s.p, s.r, evictPrompt(salt, 5)); d != want {
					t.Errorf("prompt %d: depth %d, want %d", salt, d, want)
				}
			}
		})
	}
}

// TestIndexEvictionQueueStaysBounded: an engine that stores and removes
// blocks for a long time under a bound leaves stale queue items behind;
// compaction keeps the queue within a small multiple of the live entries.
func TestIndexEvictionQueueStaysBounded(t *testing.T) {
	x := New()
	x.MaxEntries = 1 << 20
	x.ConfigurePartition(part, ebs, false)
	r := selection.Rank{WorkerID: 1}
	for i := range uint32(3000) {
		storeAll(t, x, part, r, evictPrompt(i, 8))
		if i >= 10 {
			removeAll(t, x, part, r, evictPrompt(i-10, 8))
		}
	}
	tr := x.tree(part)
	if live, queued := tr.live, tr.queue.len(); live != 80 || queued > 2*live+evictBatch {
		t.Fatalf("%d live entries, %d queued", live, queued)
	}
	if x.Counts().Evicted != 0 {
		t.Fatalf("%d evicted under the bound", x.Counts().Evicted)
	}
}
