package indexer

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// evictWorkload plays sessions against an index bounded below what the
// engines hold, and returns the share of prompt blocks the index found
// cached (what routing sees). Each session sticks to one of 8 ranks and
// runs 3 turns, each adding 16 blocks to its prompt; 70% of sessions start
// with one of 4 hot 64-block system prompts. 48 sessions are open at a
// time and 4,000 run in all. With rotate, the hot set is replaced halfway.
// Engines never evict (their caches are larger than the index's share) and
// publish what they compute, with the parent hash; a store whose parent
// the index lacks is dropped, as from a real engine. With refuse, the
// bound is applied as the index used to: blocks past it are not stored.
func evictWorkload(tb testing.TB, refuse, rotate bool, bound int64) float64 {
	const (
		bs, ranks, hotN, hotLen, turnLen, turns, open, sessions = 4, 8, 4, 64, 16, 3, 48, 4000
	)
	x := New()
	if !refuse {
		x.MaxEntries = bound
	}
	x.ConfigurePartition(part, bs, false)
	rng := rand.New(rand.NewPCG(7, 8))
	type session struct {
		id, hot, turn int
		rank          selection.Rank
	}
	engines := make([]map[uint64]bool, ranks) // engine hashes each rank holds
	for i := range engines {
		engines[i] = map[uint64]bool{}
	}
	// A prompt's block i: the hot prompt's (hot ≥ 0) for i < hotLen, the
	// session's own after. Token ids and engine hashes follow from that.
	token := func(s *session, j int) uint32 {
		if i := j / bs; s.hot >= 0 && i < hotLen {
			return uint32(1_000_000 + s.hot*hotLen*bs + j)
		}
		return uint32(10_000_000 + s.id*1000 + j)
	}
	engineHash := func(s *session, i int) uint64 {
		if s.hot >= 0 && i < hotLen {
			return uint64(s.hot)<<32 | uint64(i) | 1<<62
		}
		return uint64(s.id)<<32 | uint64(i)
	}
	var hit, total int
	var live []*session
	next, hotBase := 0, 0
	var tokens []uint32
	var blocks []uint64
	for done := 0; done < sessions; {
		for len(live) < open {
			if rotate && next == sessions/2 {
				hotBase = hotN // a new hot set
			}
			s := &session{id: next, hot: -1, rank: selection.Rank{WorkerID: uint64(rng.IntN(ranks))}}
			if rng.Float64() < 0.7 {
				s.hot = hotBase + rng.IntN(hotN)
			}
			next++
			live = append(live, s)
		}
		k := rng.IntN(len(live))
		s := live[k]
		s.turn++
		n := turnLen * s.turn
		if s.hot >= 0 {
			n += hotLen
		}
		tokens = tokens[:0]
		for j := range n * bs {
			tokens = append(tokens, token(s, j))
		}
		blocks = selection.AppendBlockHashes(blocks[:0], tokens, bs, selection.HashOptions{})
		var m selection.Matches
		x.FindMatches(part, blocks, &m)
		for _, e := range m.List {
			if e.Rank == s.rank {
				hit += int(e.Tiers.Device)
			}
		}
		total += n
		// The engine computes what it does not hold and publishes it.
		eng := engines[s.rank.WorkerID]
		have := 0
		for have < n && eng[engineHash(s, have)] {
			have++
		}
		if have < n {
			ev := &Event{Kind: Stored, BlockSize: bs}
			if have > 0 {
				ev.ParentHash, ev.HasParent = engineHash(s, have-1), true
			}
			for i := have; i < n; i++ {
				eng[engineHash(s, i)] = true
				ev.BlockHashes = append(ev.BlockHashes, engineHash(s, i))
			}
			if refuse {
				room := max(0, int(bound-x.Entries()))
				ev.BlockHashes = ev.BlockHashes[:min(room, len(ev.BlockHashes))]
			}
			ev.TokenIDs = tokens[have*bs : (have+len(ev.BlockHashes))*bs]
			if len(ev.BlockHashes) > 0 {
				_ = x.Apply(part, s.rank, ev)
			}
		}
		if s.turn == turns {
			live[k] = live[len(live)-1]
			live = live[:len(live)-1]
			done++
		}
	}
	if x.Entries() > bound {
		tb.Fatalf("%d entries over the bound of %d", x.Entries(), bound)
	}
	return float64(hit) / float64(total)
}

// BenchmarkEvictVersusRefuse reports the prefix hit ratio the index gives
// routing when its bound (20,000 entries, about a tenth of what the
// engines hold by the end) is reached, evicting the oldest entries against
// refusing new ones (the index's former behaviour), with a fixed hot set
// of system prompts and with one replaced halfway; and, for reference,
// without a bound. Run with -benchtime=1x.
func BenchmarkEvictVersusRefuse(b *testing.B) {
	for _, rotate := range []bool{false, true} {
		for _, policy := range []string{"evict", "refuse", "unbounded"} {
			name := fmt.Sprintf("hot_set=%s/policy=%s", map[bool]string{false: "fixed", true: "rotating"}[rotate], policy)
			b.Run(name, func(b *testing.B) {
				bound := int64(20_000)
				if policy == "unbounded" {
					bound = 1 << 40
				}
				var ratio float64
				for b.Loop() {
					ratio = evictWorkload(b, policy == "refuse", rotate, bound)
				}
				b.ReportMetric(ratio, "hit_ratio")
			})
		}
	}
}

// BenchmarkEvictFleet: 1,024 ranks storing 16-block prompts in turn into
// an index at its bound (2^18 entries, a share of 256 each), so every store
// evicts as many entries as it adds. It reports what a stored block costs,
// its store and the eviction it causes, in ns/block.
func BenchmarkEvictFleet(b *testing.B) {
	const ranks, chain, bs, bound = 1024, 16, 4, 1 << 18
	x := New()
	x.MaxEntries = bound
	x.ConfigurePartition(part, bs, false)
	tokens := make([]uint32, chain*bs)
	ev := &Event{Kind: Stored, BlockSize: bs, TokenIDs: tokens, BlockHashes: make([]uint64, chain)}
	n := 0
	store := func() {
		for i := range tokens {
			tokens[i] = uint32(n*len(tokens) + i)
		}
		for i := range ev.BlockHashes {
			ev.BlockHashes[i] = uint64(n)<<8 | uint64(i)
		}
		if err := x.Apply(part, selection.Rank{WorkerID: uint64(n % ranks)}, ev); err != nil {
			b.Fatal(err)
		}
		n++
	}
	for range 2 * bound / chain {
		store()
	}
	evicted := x.Counts().Evicted
	for b.Loop() {
		store()
	}
	if x.Counts().Evicted == evicted || x.Entries() > bound {
		b.Fatalf("%d entries, %d evicted while measured: not at the bound", x.Entries(), x.Counts().Evicted-evicted)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*chain), "ns/block")
}
