package indexer

import (
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
