package indexer

import (
	"slices"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// decodedSteady decodes BenchmarkDecodeApply's steady-state payloads
// into events of their own (a Decoder's events alias its buffers).
func decodedSteady(tb testing.TB) steady[[]Event] {
	var d Decoder
	return mapSteady(steadyPayloads(EncodingArray, 1, 2), func(p []byte) []Event {
		batch, err := d.Decode(p)
		if err != nil {
			tb.Fatal(err)
		}
		var evs []Event
		for _, ev := range batch.Events {
			ev.BlockHashes = slices.Clone(ev.BlockHashes)
			ev.TokenIDs = slices.Clone(ev.TokenIDs)
			evs = append(evs, ev)
		}
		return evs
	})
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
	prepared := mapSteady(events, func(evs []Event) []hashed {
		var hs []hashed
		for k := range evs {
			h := t.hashStore(&evs[k])
			h.buf = nil // kept for the whole run, not pooled
			hs = append(hs, h)
		}
		return hs
	})
	r := selection.Rank{WorkerID: 1}
	cpu := startCPU(b)
	i := 0
	for b.Loop() {
		evs, hs := events.at(i), prepared.at(i)
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
		evs := events.at(i)
		for k := range evs {
			t.hashStore(&evs[k]).release()
		}
		i++
	}
	b.ReportMetric(cpu.per(b.N*blocksPer), "cpu-ns/block")
}
