package indexer

import (
	"math/rand/v2"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// BenchmarkFindMatchesCold looks up prompts the caches have not seen
// lately, as a gateway's stream of different sessions does: 512 prompts
// of 2,048 blocks (32k tokens, block size 16), each held by 4 of 1,024
// workers (~4M entries), looked up in turn, so each lookup walks blocks
// whose table slots and records the lookups before it pushed out of the
// caches. The chain keys are computed once per prompt beforehand (the
// router hands the index its sequence hashes), so the figure is the walk.
func BenchmarkFindMatchesCold(b *testing.B) {
	const bs, prompts, blocks, holders = 16, 512, 2048, 4
	x := New()
	x.ConfigurePartition(part, bs, false)
	rng := rand.New(rand.NewPCG(11, 12))
	chains := make([][]uint64, prompts)
	for p := range chains {
		tokens := make([]uint32, blocks*bs)
		for i := range tokens {
			tokens[i] = uint32(rng.IntN(150000))
		}
		for h := range holders {
			ev := &Event{Kind: Stored, BlockSize: bs, TokenIDs: tokens}
			for range blocks {
				ev.BlockHashes = append(ev.BlockHashes, rng.Uint64())
			}
			if err := x.Apply(part, selection.Rank{WorkerID: uint64((p*holders + h) % 1024)}, ev); err != nil {
				b.Fatal(err)
			}
		}
		locals := selection.AppendBlockHashes(nil, tokens, bs, selection.HashOptions{})
		chains[p] = selection.AppendSequenceHashes(nil, locals)
	}
	var m selection.Matches
	b.ResetTimer()
	cpu := startCPU(b)
	i := 0
	for b.Loop() {
		m.Reset()
		c := chains[i%prompts]
		x.FindMatchesChain(part, c, &m)
		i++
	}
	b.ReportMetric(cpu.per(b.N), "cpu-ns/op")
	b.ReportMetric(float64(x.Entries()), "entries")
	if len(m.List) != holders || m.List[0].Tiers.Device != blocks {
		b.Fatalf("%d ranks matched (want %d), the first %d blocks deep (want %d)", len(m.List), holders, m.List[0].Tiers.Device, blocks)
	}
}
