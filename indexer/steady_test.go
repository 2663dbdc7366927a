package indexer

import (
	"math/rand/v2"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestSteadyPayloadsAreSteady holds the benchmarks' steady state to what
// they say it is: after the opening, every payload removes blocks the
// rank holds and the index holds win payloads' blocks throughout, lap
// after lap. (The benchmarks' payloads were once not a cycle, and a
// quarter of each lap removed nothing.)
func TestSteadyPayloadsAreSteady(t *testing.T) {
	const n, win = 40, 12
	s := steadyCycle(EncodingArray, rand.New(rand.NewPCG(1, 2)), n, win, blocksPer)
	x := New()
	x.ConfigurePartition(part, 16, false)
	r := selection.Rank{WorkerID: 1}
	var d Decoder
	for seq := range win + 3*n {
		batch, err := d.Decode(s.at(seq))
		if err != nil {
			t.Fatal(err)
		}
		if refused := x.ApplyBatch(part, r, batch.Events); refused != 0 {
			t.Fatalf("payload %d: %d events refused", seq, refused)
		}
		want := min(seq+1, win) * blocksPer
		if got := int(x.Entries()); got != want {
			t.Fatalf("after payload %d: %d entries, want %d", seq, got, want)
		}
	}
	if u := x.counters.unknownBlock.Load(); u != 0 {
		t.Fatalf("%d removals of blocks the rank did not hold", u)
	}
}
