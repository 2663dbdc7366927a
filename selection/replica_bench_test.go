package selection

import (
	"fmt"
	"testing"
)

// BenchmarkRemoteReserveAtAFullTable: at a table full of 256 origins (the
// defaults' 524,288 bookings), a newcomer's booking evicts one of another
// origin's and is freed, and a filler books one (the table full once
// more): one eviction an op, what a flood of new names costs the receive
// goroutine.
func BenchmarkRemoteReserveAtAFullTable(b *testing.B) {
	r := newTestRouter(b, nil)
	addWorker(b, r, 1, nil)
	rm := r.Remote()
	const origins, perOrigin = 256, 65536
	share := maxOriginsInFull * perOrigin / origins
	for o := range origins {
		for i := range share {
			rm.Reserve(fmt.Sprint("o", o), &BookingRecord{ID: fmt.Sprint(i), Rank: Rank{WorkerID: 1}, PrefillTokens: 5}, perOrigin)
		}
	}
	if rm.Total() != maxOriginsInFull*perOrigin {
		b.Fatalf("table %d, want full", rm.Total())
	}
	rec := &BookingRecord{ID: "n", Rank: Rank{WorkerID: 1}, PrefillTokens: 5}
	i := 0
	for b.Loop() {
		if rm.Reserve("newcomer", rec, perOrigin) != RemoteApplied {
			b.Fatal("the newcomer refused")
		}
		rm.Free("newcomer", "n")
		i++ // the table full again
		rm.Reserve("filler", &BookingRecord{ID: fmt.Sprint(i), Rank: Rank{WorkerID: 1}, PrefillTokens: 5}, perOrigin)
	}
}
