package selection

import (
	"math/rand/v2"
	"testing"
	"time"
)

// naiveApprox is the reference model of ApproxIndex: per rank, a map from
// chain key to expiry, walked block by block.
type naiveApprox struct {
	ttl   time.Duration
	ranks map[Rank]map[uint64]int64
}

func (m *naiveApprox) record(r Rank, keys []uint64, now int64) {
	held := m.ranks[r]
	if held == nil {
		held = map[uint64]int64{}
		m.ranks[r] = held
	}
	for _, k := range keys {
		held[k] = now + int64(m.ttl)
	}
}

func (m *naiveApprox) depth(r Rank, keys []uint64, now int64) uint32 {
	d := uint32(0)
	for _, k := range keys {
		if e, ok := m.ranks[r][k]; !ok || e <= now {
			break
		}
		d++
	}
	return d
}

// TestApproxIndexMatchesNaiveModel runs random bookings, clock moves and
// lookups against ApproxIndex and the naive model; every lookup must agree.
func TestApproxIndexMatchesNaiveModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 9))
	now := time.Unix(1000, 0)
	ai := NewApproxIndex(time.Minute)
	ai.now = func() time.Time { return now }
	ref := &naiveApprox{ttl: time.Minute, ranks: map[Rank]map[uint64]int64{}}
	k := PartitionKey{"m", "g"}
	// Prompts share prefixes: each is a random number of blocks drawn from
	// one of a few base sequences.
	bases := make([][]uint64, 4)
	for i := range bases {
		bases[i] = make([]uint64, 64)
		for j := range bases[i] {
			bases[i][j] = rng.Uint64()
		}
	}
	prompt := func() []uint64 { return bases[rng.IntN(len(bases))][:1+rng.IntN(64)] }
	for step := range 5000 {
		switch rng.IntN(10) {
		case 0:
			now = now.Add(time.Duration(rng.IntN(40)) * time.Second)
		case 1, 2, 3:
			blocks := prompt()
			r := Rank{uint64(rng.IntN(6)), 0}
			ai.RecordBooking(k, r, blocks)
			ref.record(r, AppendSequenceHashes(nil, blocks), now.UnixNano())
		default:
			blocks := prompt()
			var m Matches
			ai.FindMatches(k, blocks, &m)
			got := map[Rank]uint32{}
			for _, x := range m.List {
				got[x.Rank] = x.Tiers.Device
			}
			keys := AppendSequenceHashes(nil, blocks)
			for r := range ref.ranks {
				if want := ref.depth(r, keys, now.UnixNano()); got[r] != want {
					t.Fatalf("step %d rank %v: depth %d, model says %d", step, r, got[r], want)
				}
			}
		}
	}
}

// TestLoadTrieMatchesNaiveModel books and frees random prompts that share
// prefixes and checks the trie against a naive model: a rank's hit count is
// the longest prefix any of its bookings shares with the query, and its
// decode blocks are its distinct booked prefixes.
func TestLoadTrieMatchesNaiveModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	tr := newLoadTracker()
	ranks := make([]*rankState, 5)
	for i := range ranks {
		ranks[i] = &rankState{idx: i, rank: Rank{uint64(i), 0}}
	}
	bases := make([][]uint64, 3)
	for i := range bases {
		bases[i] = make([]uint64, 80)
		for j := range bases[i] {
			bases[i][j] = rng.Uint64()
		}
	}
	chain := func() []uint64 {
		return AppendSequenceHashes(nil, bases[rng.IntN(len(bases))][:1+rng.IntN(80)])
	}
	var live []*booking
	for step := range 4000 {
		if rng.IntN(3) == 0 && len(live) > 0 {
			i := rng.IntN(len(live))
			tr.free(live[i], true)
			live = append(live[:i], live[i+1:]...)
		} else {
			b := &booking{rs: ranks[rng.IntN(len(ranks))], hashes: chain()}
			tr.add(b, true)
			live = append(live, b)
		}
		q := chain()
		hits := make([]uint32, len(ranks))
		tr.countActive(q, hits)
		for i, rs := range ranks {
			want, distinct := 0, map[uint64]bool{}
			for _, b := range live {
				if b.rs == rs {
					want = max(want, commonPrefix(b.hashes, q))
					for _, h := range b.hashes {
						distinct[h] = true
					}
				}
			}
			if int(hits[i]) != want {
				t.Fatalf("step %d rank %d: trie hits %d, model %d", step, i, hits[i], want)
			}
			if rs.decodeBlocks() != uint64(len(distinct)) {
				t.Fatalf("step %d rank %d: decode blocks %d, model %d", step, i, rs.decodeBlocks(), len(distinct))
			}
		}
	}
	for _, b := range live {
		tr.free(b, true)
	}
	if len(tr.root.children) != 0 {
		t.Fatalf("%d edges left after every booking was freed", len(tr.root.children))
	}
	for i, rs := range ranks {
		if rs.decodeWeight != 0 || rs.requests != 0 {
			t.Fatalf("rank %d left with weight %v, requests %d", i, rs.decodeWeight, rs.requests)
		}
	}
}
