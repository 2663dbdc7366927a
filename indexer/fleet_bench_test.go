package indexer

import (
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// The fleet-scale distributions of issue 15: 1,024 worker ranks, block
// size 16, engine blocks stored in chains of 64 as an engine stores a
// prompt, under a bound twice what is stored so the eviction queue counts
// (the gateway always runs bounded: index_max_memory has a default).
const (
	fleetWorkers   = 1024
	fleetBlockSize = 16
	fleetChain     = 64
	// fleetSystemBlocks is the shared 16k-token system prompt, in blocks.
	fleetSystemBlocks = 16_000 / fleetBlockSize
)

// fleetEntries is how many (block, rank) entries a fleet benchmark builds:
// INDEX_BENCH_ENTRIES when set (the 64M needs ~10 GB before the
// redesign), else 4M.
func fleetEntries(tb testing.TB) int {
	if s := os.Getenv("INDEX_BENCH_ENTRIES"); s != "" {
		n, err := strconv.Atoi(s)
		// Below this the seed-like fleet's ranks would not even hold the
		// system prompt and a prompt of their own.
		const least = fleetWorkers * (fleetSystemBlocks + fleetChain)
		if err != nil || n < least {
			tb.Fatalf("INDEX_BENCH_ENTRIES=%q: want a count of at least %d", s, least)
		}
		return n
	}
	return 4 << 20
}

// fleetBuilder stores chains of fresh random blocks for a rank.
type fleetBuilder struct {
	tb     testing.TB
	x      *Index
	rng    *rand.Rand
	tokens []uint32
	ev     Event
}

func newFleetBuilder(tb testing.TB, entries int) *fleetBuilder {
	x := New()
	x.MaxEntries = int64(2 * entries)
	x.ConfigurePartition(part, fleetBlockSize, false)
	return &fleetBuilder{tb: tb, x: x, rng: rand.New(rand.NewPCG(15, 1)),
		tokens: make([]uint32, fleetChain*fleetBlockSize)}
}

// store stores blocks new blocks (with tokens from next, engine hashes
// from engine) for rank r under parent; it returns the last engine hash.
func (f *fleetBuilder) store(r selection.Rank, parent *uint64, tokens []uint32, engine []uint64) uint64 {
	f.ev = Event{Kind: Stored, BlockSize: fleetBlockSize, TokenIDs: tokens, BlockHashes: engine}
	if parent != nil {
		f.ev.HasParent, f.ev.ParentHash = true, *parent
	}
	if err := f.x.Apply(part, r, &f.ev); err != nil {
		f.tb.Fatal(err)
	}
	return engine[len(engine)-1]
}

// uniqueChains stores blocks unique blocks for rank r in chains of
// fleetChain under parent (nil: chains of their own).
func (f *fleetBuilder) uniqueChains(r selection.Rank, parent *uint64, blocks int) {
	engine := make([]uint64, fleetChain)
	for blocks > 0 {
		n := min(blocks, fleetChain)
		for i := range f.tokens[:n*fleetBlockSize] {
			f.tokens[i] = uint32(f.rng.IntN(150_000))
		}
		for i := range engine[:n] {
			engine[i] = f.rng.Uint64()
		}
		f.store(r, parent, f.tokens[:n*fleetBlockSize], engine[:n])
		blocks -= n
	}
}

// buildSeedLike builds the seed-like fleet: every rank holds the shared
// system prompt (the same engine hashes on every rank, as a deterministic
// engine gives) and sessions of its own under it, entries in all.
func buildSeedLike(tb testing.TB, entries int) *Index {
	f := newFleetBuilder(tb, entries)
	system := make([]uint32, fleetSystemBlocks*fleetBlockSize)
	for i := range system {
		system[i] = uint32(f.rng.IntN(150_000))
	}
	systemEngine := make([]uint64, fleetSystemBlocks)
	for i := range systemEngine {
		systemEngine[i] = f.rng.Uint64()
	}
	perRank := entries / fleetWorkers
	for w := range fleetWorkers {
		r := selection.Rank{WorkerID: uint64(w)}
		last := f.store(r, nil, system, systemEngine)
		f.uniqueChains(r, &last, perRank-fleetSystemBlocks)
	}
	return f.x
}

// buildSingleOwner builds a fleet where every block is on exactly one
// rank: entries/1,024 blocks per rank in chains of their own.
func buildSingleOwner(tb testing.TB, entries int) *Index {
	f := newFleetBuilder(tb, entries)
	for w := range fleetWorkers {
		f.uniqueChains(selection.Rank{WorkerID: uint64(w)}, nil, entries/fleetWorkers)
	}
	return f.x
}

// benchmarkFleetMemory reports (as BenchmarkIndexMemory's seed_like and
// single_owner) the heap per (block, rank) entry of issue 15's two
// distributions, at INDEX_BENCH_ENTRIES entries (4M by default). At 4M
// entries the seed-like fleet's shared prompt is a quarter of the
// entries; at 64M it is 1.6 %, so its figure approaches single_owner's.
func benchmarkFleetMemory(b *testing.B) {
	entries := fleetEntries(b)
	for _, d := range []struct {
		name  string
		build func(testing.TB, int) *Index
	}{{"seed_like", buildSeedLike}, {"single_owner", buildSingleOwner}} {
		b.Run(d.name, func(b *testing.B) {
			var perEntry, held float64
			for b.Loop() {
				before := heapAlloc()
				x := d.build(b, entries)
				held = float64(x.Entries())
				perEntry = float64(heapAlloc()-before) / held
				runtime.KeepAlive(x)
			}
			b.ReportMetric(perEntry, "B/entry")
			b.ReportMetric(held, "entries")
		})
	}
}
