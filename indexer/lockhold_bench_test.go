package indexer

import (
	"slices"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// decodedSteady decodes BenchmarkDecodeApply's steady-state payloads
// into events of their own (a Decoder's events alias its buffers).
func decodedSteady(tb testing.TB) [][]Event {
	var d Decoder
	out := make([][]Event, nPayloads)
	for i, p := range steadyPayloads(EncodingArray, 1, 2) {
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
		evs, hs := events[i%nPayloads], prepared[i%nPayloads]
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
		evs := events[i%nPayloads]
		for k := range evs {
			t.hashStore(&evs[k]).release()
		}
		i++
	}
	b.ReportMetric(cpu.per(b.N*blocksPer), "cpu-ns/block")
}
