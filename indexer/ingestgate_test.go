package indexer

import (
	"net"
	"testing"
	"time"
)

// A listener applies nothing while every ingest turn is taken, and
// catches up once one is free.
func TestListenerWaitsForAnIngestTurn(t *testing.T) {
	f := newFixture(t, false, false)
	f.index.IngestCores = 1
	f.listen()
	f.index.enterIngest() // the only turn
	prompt := testPrompt(1)
	f.pub.publish(chunk(EncodingArray, -1, prompt, 0, 10), true)
	eventually(t, "message received", func() bool { return f.stats.Messages.Load() == 1 })
	time.Sleep(100 * time.Millisecond)
	if n := f.stats.Batches.Load(); n != 0 {
		f.index.leaveIngest()
		t.Fatalf("%d batches applied without a turn", n)
	}
	f.index.leaveIngest()
	f.waitBatches(1)
	if d := f.depth(f.rank, prompt); d != 10 {
		t.Fatalf("depth %d, want 10", d)
	}
}

// With IngestCores unset, ingest gets every core but one, and at least
// one.
func TestIngestCoresDefault(t *testing.T) {
	x := New()
	x.enterIngest()
	defer x.leaveIngest()
	if got, want := cap(x.ingest.slots), defaultIngestCores(); got != want || want < 1 {
		t.Fatalf("%d turns, want %d (at least 1)", got, want)
	}
}

// A listener gives its turn back when its socket runs dry: with one turn,
// a second publisher's payload is still applied after the first one's.
func TestListenersTakeTurns(t *testing.T) {
	x := New()
	x.IngestCores = 1
	x.turnHold = time.Hour // only running dry gives the turn back
	x.ConfigurePartition(part, lbs, false)
	f := newLoopFleet(t, x, 2, nil)
	prompt := testPrompt(1)
	for i := range f.pubs {
		f.pubs[i].publish(chunk(EncodingArray, -1, prompt, 0, 10), true)
		eventually(t, "batch applied", func() bool { return f.stats[i].Batches.Load() == 1 })
	}
}

// A listener waiting for a replay's reply holds up no other listener:
// with one turn, held by the loop until it parks, another publisher's
// payload is applied while the replay still waits (its endpoint never
// answers, so it ends only at its timeout, counting the gap lost).
func TestReplayWaitsWithoutTheTurn(t *testing.T) {
	x := New()
	x.IngestCores = 1
	x.turnHold = time.Hour // only a wait gives the turn back
	x.ConfigurePartition(part, lbs, false)
	deaf, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deaf.Close() })
	f := newLoopFleet(t, x, 2, func(i int, cfg *ListenerConfig) {
		if i == 0 {
			cfg.Replay, cfg.ReplayTimeout = "tcp://"+deaf.Addr().String(), 3*time.Second
		}
	})
	pubs, stats := f.pubs, f.stats
	prompt := testPrompt(1)
	pubs[0].publish(chunk(EncodingArray, -1, prompt, 0, 10), true)
	eventually(t, "first batch applied", func() bool { return stats[0].Batches.Load() == 1 })
	pubs[0].jumpTo(5)
	pubs[0].publish(chunk(EncodingArray, -1, prompt, 10, 20), true)
	eventually(t, "replay under way", func() bool { return stats[0].Replays.Load() == 1 })
	pubs[1].publish(chunk(EncodingArray, -1, prompt, 0, 10), true)
	eventually(t, "other publisher applied", func() bool { return stats[1].Batches.Load() == 1 })
	if lost := stats[0].Lost.Load(); lost != 0 {
		t.Fatalf("lost %d: the other publisher was applied only after the replay", lost)
	}
	eventually(t, "replay timed out", func() bool { return stats[0].Batches.Load() == 2 })
	if lost := stats[0].Lost.Load(); lost != 4 { // sequences 1-4
		t.Fatalf("lost %d after the replay's timeout, want 4", lost)
	}
}
