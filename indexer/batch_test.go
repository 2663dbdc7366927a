package indexer

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestApplyBatchMatchesApply: a payload applied by ApplyBatch leaves the
// index as Apply, event by event, leaves it, and refuses the same events:
// random chains of stores (some on unknown parents, some with token ids
// that do not fill their blocks), removals of held and unknown hashes,
// skipped events and clears, in payloads large enough to be split at
// batchBlocks, with and without an entry bound.
func TestApplyBatchMatchesApply(t *testing.T) {
	for _, bound := range []int64{0, 700} {
		rng := rand.New(rand.NewPCG(7, uint64(bound)))
		one, batched := New(), New()
		one.MaxEntries, batched.MaxEntries = bound, bound
		one.ConfigurePartition(part, 4, false)
		batched.ConfigurePartition(part, 4, false)
		var held []uint64 // engine hashes stored so far, per rank 0
		for payload := range 300 {
			events := randomPayload(rng, &held)
			r := selection.Rank{WorkerID: uint64(payload % 3)}
			want := 0
			for i := range events {
				if one.Apply(part, r, &events[i]) != nil {
					want++
				}
			}
			if got := batched.ApplyBatch(part, r, events); got != want {
				t.Fatalf("bound %d, payload %d: ApplyBatch refused %d events, Apply %d", bound, payload, got, want)
			}
		}
		if a, b := one.Entries(), batched.Entries(); a != b || a == 0 {
			t.Fatalf("bound %d: entries %d event by event, %d batched", bound, a, b)
		}
		if a, b := dumpSet(t, one), dumpSet(t, batched); !slices.Equal(a, b) {
			for i := range min(len(a), len(b)) {
				if a[i] != b[i] {
					t.Fatalf("bound %d: the dumps differ (%d and %d events), first at %d:\n%s\n%s", bound, len(a), len(b), i, a[i], b[i])
				}
			}
			t.Fatalf("bound %d: the dumps differ (%d and %d events)", bound, len(a), len(b))
		}
		if bound > 0 && one.Counts().Evicted == 0 {
			t.Fatalf("bound %d: nothing was evicted; the bounded case tests nothing", bound)
		}
	}
	if got := New().ApplyBatch(part, selection.Rank{}, make([]Event, 3)); got != 3 {
		t.Fatalf("an unconfigured partition refused %d of 3 events", got)
	}
}

// randomPayload is 1–6 events: mostly stores chained on a held hash (or on
// none), some removals, now and then a malformed store, a skipped event or
// a clear.
func randomPayload(rng *rand.Rand, held *[]uint64) []Event {
	var events []Event
	for range 1 + rng.IntN(6) {
		switch k := rng.IntN(20); {
		case k < 12:
			n := 1 + rng.IntN(200)
			ev := Event{Kind: Stored, BlockSize: 4}
			if len(*held) > 0 && rng.IntN(3) > 0 {
				ev.HasParent, ev.ParentHash = true, (*held)[rng.IntN(len(*held))]
			}
			if k == 11 {
				ev.HasParent, ev.ParentHash = true, rng.Uint64() // unknown parent
			}
			for range n {
				h := rng.Uint64()
				ev.BlockHashes = append(ev.BlockHashes, h)
				*held = append(*held, h)
			}
			tokens := n * 4
			if k == 10 {
				tokens-- // does not fill the blocks
			}
			for range tokens {
				ev.TokenIDs = append(ev.TokenIDs, uint32(rng.IntN(64))) // few ids: blocks repeat
			}
			events = append(events, ev)
		case k < 17 && len(*held) > 0:
			ev := Event{Kind: Removed}
			for range 1 + rng.IntN(40) {
				ev.BlockHashes = append(ev.BlockHashes, (*held)[rng.IntN(len(*held))])
			}
			ev.BlockHashes = append(ev.BlockHashes, rng.Uint64()) // unknown
			events = append(events, ev)
		case k < 19:
			events = append(events, Event{Kind: Stored, Skip: true, BlockSize: 4, BlockHashes: []uint64{1}, TokenIDs: []uint32{1, 2, 3, 4}})
		default:
			events = append(events, Event{Kind: Cleared})
		}
	}
	return events
}

// dumpSet is a partition's dump as sorted JSON lines, without the event
// ids that number them (a dump's order follows the tables' seeds).
func dumpSet(t *testing.T, x *Index) []string {
	var lines []string
	for _, ev := range x.Dump(part) {
		ev.Event.EventID = 0
		b, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, string(b))
	}
	slices.Sort(lines)
	return lines
}
