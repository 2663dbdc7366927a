package indexer

import (
	"slices"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// decodedSteady decodes BenchmarkDecodeApply's steady-state payloads
// into events of their own (a Decoder's events alias its buffers), in the
// order of their sequence numbers: the first lap's opening, then one
// cycle, to go round from index window on (steadyEvent).
func decodedSteady(tb testing.TB) [][]Event {
	var d Decoder
	s := steadyPayloads(EncodingArray, 1, 2)
	out := make([][]Event, window+nPayloads)
	for i, p := range append(s.opening[:window:window], s.cycle...) {
		batch, err := d.Decode(p)
		if err != nil {
			tb.Fatal(err)
		}
		for _, ev := range batch.Events {
			ev.BlockHashes = slices.Clone(ev.BlockHashes)
			ev.TokenIDs = slices.Clone(ev.TokenIDs)
			out[i] = append(out[i], ev)
		}
	}
	return out
}

// steadyEvent is the index into decodedSteady's events of the payload
// with sequence number seq.
func steadyEvent(seq int) int {
	if seq < window {
		return seq
	}
	return window + seq%nPayloads
}

// BenchmarkApplyLockHold measures how long an event holds its tree's
// write lock: the CPU time of the locked part of Apply alone (the same
// steady state as BenchmarkDecodeApply, decoded and hashed beforehand),
// per stored block with its removal. Every other listener of the
// partition and every lookup waits that long per block.
func BenchmarkApplyLockHold(b *testing.B) {
	x := New()
	x.ConfigurePartition(part, 16, false)
	t := x.tree(part)
	events := decodedSteady(b)
	prepared := make([][]hashed, len(events))
	for i, evs := range events {
		for k := range evs {
			h := t.hashStore(&evs[k])
			h.buf = nil // kept for the whole run, not pooled
			prepared[i] = append(prepared[i], h)
		}
	}
	r := selection.Rank{WorkerID: 1}
	cpu := startCPU(b)
	i := 0
	for b.Loop() {
		evs, hs := events[steadyEvent(i)], prepared[steadyEvent(i)]
		for k := range evs {
			t.mu.Lock()
			_ = t.apply(x, r, &evs[k], hs[k])
			t.tidy()
			t.mu.Unlock()
		}
		i++
	}
	b.ReportMetric(cpu.per(b.N*blocksPer), "cpu-ns/block")
}

// BenchmarkStoreHashing measures what Apply now does before taking the
// lock: hashing a store's blocks (BenchmarkApplyLockHold's events), per
// stored block.
func BenchmarkStoreHashing(b *testing.B) {
	x := New()
	x.ConfigurePartition(part, 16, false)
	t := x.tree(part)
	events := decodedSteady(b)
	cpu := startCPU(b)
	i := 0
	for b.Loop() {
		evs := events[steadyEvent(i)]
		for k := range evs {
			t.hashStore(&evs[k]).release()
		}
		i++
	}
	b.ReportMetric(cpu.per(b.N*blocksPer), "cpu-ns/block")
}
