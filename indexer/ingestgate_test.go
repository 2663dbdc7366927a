package indexer

import (
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvrouter/caddy-kvrouter/selection"
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
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	x := New()
	x.IngestCores = 1
	x.turnHold = time.Hour // only running dry gives the turn back
	x.ConfigurePartition(part, lbs, false)
	var pubs [2]*testPublisher
	var stats [2]Stats
	for i := range pubs {
		pubs[i] = newTestPublisherOn(t, zctx, false, "127.0.0.1")
		l, err := StartListener(zctx, x, &stats[i], nil, ListenerConfig{Endpoint: pubs[i].pubEP, Partition: part, Rank: selection.Rank{WorkerID: uint64(i + 1)}})
		if err != nil {
			t.Fatal(err)
		}
		pubs[i].waitSubscribed()
		t.Cleanup(func() { l.Stop() })
	}
	t.Cleanup(func() {
		for _, p := range pubs {
			p.close()
		}
		_ = zctx.Term()
	})
	prompt := testPrompt(1)
	for i := range pubs {
		pubs[i].publish(chunk(EncodingArray, -1, prompt, 0, 10), true)
		eventually(t, "batch applied", func() bool { return stats[i].Batches.Load() == 1 })
	}
}
