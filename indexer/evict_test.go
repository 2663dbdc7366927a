package indexer

import (
	"sync"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

const ebs = 2 // block size of the eviction tests

// queued is how many items the tree's queues hold, stale ones included.
func (t *tree) queued() int {
	n := 0
	for i := range t.queues {
		n += t.queues[i].len()
	}
	return n
}

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

// TestIndexEvictsByShare: with MaxEntries 10, stores of 5-block prompts
// go in whatever the index holds and evict entries of the ranks holding
// more than their share of the bound (10 over the ranks that stored,
// in all partitions), oldest first. A rank within its share keeps what it
// holds however much another stores. A prompt looked up since it was
// stored is spared once; entries removed by the engine leave stale queue
// items that evict nothing; a prompt removed and stored again counts from
// its new store, not its first.
func TestIndexEvictsByShare(t *testing.T) {
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
		{"the rank over its share gives way, not the oldest", []step{
			{"store", part, r1, 1}, {"store", part, r2, 2}, {"store", part, r2, 3},
		}, []uint32{1, 3}, 5},
		{"a flood evicts its own entries only", []step{
			{"store", part, r1, 1}, {"store", part, r2, 2}, {"store", part, r2, 3},
			{"store", part, r2, 4}, {"store", part, r2, 5},
		}, []uint32{1, 5}, 15},
		{"across partitions", []step{
			{"store", other, r1, 1}, {"store", part, r1, 2}, {"store", other, r1, 3},
		}, []uint32{2, 3}, 5},
		{"removed entries are not evicted twice", []step{
			{"store", part, r1, 1}, {"remove", part, r1, 1}, {"store", part, r1, 2}, {"store", part, r1, 3},
		}, []uint32{2, 3}, 0},
		{"a looked-up prompt gets a second turn", []step{
			{"store", part, r1, 1}, {"store", part, r1, 2}, {"lookup", part, r1, 1}, {"store", part, r1, 3},
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

// TestIndexEvictsOldestOverShare: of the ranks over their share, the one
// whose oldest entry is oldest goes first, across partitions, and each
// only down to its share. Stored under a loose bound, then the bound
// tightened to 16: 25 entries over 3 ranks, a share of 5. Rank 1 (oldest,
// 10) gives up its first prompt; rank 2 (10) gives up 4 of its first
// prompt's blocks, which is enough; rank 3, within its share, nothing.
func TestIndexEvictsOldestOverShare(t *testing.T) {
	other := selection.PartitionKey{Model: "m2", Group: "g"}
	r1, r2, r3 := selection.Rank{WorkerID: 1}, selection.Rank{WorkerID: 2}, selection.Rank{WorkerID: 3}
	x := New()
	x.MaxEntries = 1000
	x.ConfigurePartition(part, ebs, false)
	x.ConfigurePartition(other, ebs, false)
	storeAll(t, x, part, r1, evictPrompt(1, 5))
	storeAll(t, x, other, r2, evictPrompt(2, 5))
	storeAll(t, x, part, r1, evictPrompt(3, 5))
	storeAll(t, x, other, r2, evictPrompt(4, 5))
	x.MaxEntries = 16
	storeAll(t, x, part, r3, evictPrompt(5, 5))
	if got := [3]int{x.Blocks(part, r1), x.Blocks(other, r2), x.Blocks(part, r3)}; got != [3]int{5, 6, 5} || x.Counts().Evicted != 9 {
		t.Fatalf("entries of ranks 1, 2, 3: %v, evicted %d; want [5 6 5], 9", got, x.Counts().Evicted)
	}
	for _, c := range []struct {
		p      selection.PartitionKey
		r      selection.Rank
		prompt uint32
		depth  uint32
	}{{part, r1, 1, 0}, {part, r1, 3, 5}, {other, r2, 2, 0}, {other, r2, 4, 5}, {part, r3, 5, 5}} {
		if d := depthOf(x, c.p, c.r, evictPrompt(c.prompt, 5)); d != c.depth {
			t.Errorf("prompt %d: depth %d, want %d", c.prompt, d, c.depth)
		}
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
	if live, queued := tr.live, tr.queued(); live != 80 || queued > 2*live+evictBatch {
		t.Fatalf("%d live entries, %d queued", live, queued)
	}
	if x.Counts().Evicted != 0 {
		t.Fatalf("%d evicted under the bound", x.Counts().Evicted)
	}
}

// TestIndexEvictsConcurrently: four publishers over two partitions store
// past the bound at once, with lookups beside them (run under -race in
// CI). The index ends within its bound, having evicted, and no rank is
// left with less than its share while another holds more: every rank
// stored far past its share, so all end near it.
func TestIndexEvictsConcurrently(t *testing.T) {
	other := selection.PartitionKey{Model: "m2", Group: "g"}
	x := New()
	x.MaxEntries = 400
	x.ConfigurePartition(part, ebs, false)
	x.ConfigurePartition(other, ebs, false)
	var wg sync.WaitGroup
	for w := range 4 {
		p := []selection.PartitionKey{part, other}[w%2]
		r := selection.Rank{WorkerID: uint64(w)}
		wg.Go(func() {
			for i := range uint32(200) {
				storeAll(t, x, p, r, evictPrompt(uint32(w)*1000+i, 5))
				depthOf(x, p, r, evictPrompt(uint32(w)*1000+i/2, 5))
			}
		})
	}
	wg.Wait()
	if x.Entries() > x.MaxEntries || x.Counts().Evicted == 0 {
		t.Fatalf("%d entries, %d evicted; want at most %d, some evicted", x.Entries(), x.Counts().Evicted, x.MaxEntries)
	}
	for w := range 4 {
		p := []selection.PartitionKey{part, other}[w%2]
		if n := x.Blocks(p, selection.Rank{WorkerID: uint64(w)}); n < 100-evictSlack || n > 100+evictSlack {
			t.Errorf("rank %d holds %d entries; its share is 100", w, n)
		}
	}
}

// evictSlack is how far from its share a rank may end when ranks store
// at once: a store lands before the eviction that makes room for it.
const evictSlack = 3 * 5
