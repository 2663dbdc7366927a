package selection

import (
	"testing"
	"time"
)

// TestApproxDumpLimit: the approximate index dumps a parent-first prefix
// of at most limit events, truncated only when more were left.
func TestApproxDumpLimit(t *testing.T) {
	ai := NewApproxIndex(time.Minute)
	k := PartitionKey{"m", "g"}
	ai.RecordBooking(k, Rank{1, 0}, []uint64{1, 2, 3})
	ai.RecordBooking(k, Rank{2, 0}, []uint64{1, 2, 4})
	all := ai.Dump(k)
	if len(all) != 6 {
		t.Fatalf("%d events, want 6", len(all))
	}
	for _, tc := range []struct {
		limit, n  int
		truncated bool
	}{{0, 6, false}, {-1, 6, false}, {6, 6, false}, {7, 6, false}, {5, 5, true}, {1, 1, true}} {
		ev, truncated := ai.DumpLimit(k, tc.limit)
		if len(ev) != tc.n || truncated != tc.truncated {
			t.Errorf("limit %d: %d events, truncated %v; want %d, %v", tc.limit, len(ev), truncated, tc.n, tc.truncated)
		}
		held := map[uint64]bool{}
		for _, e := range ev {
			st := e.Event.Data.Stored
			if st.ParentHash != nil && !held[*st.ParentHash] {
				t.Errorf("limit %d: an event before its parent", tc.limit)
			}
			held[st.Blocks[0].BlockHash] = true
		}
	}
	if ev, truncated := ai.DumpLimit(PartitionKey{"x", "y"}, 3); ev != nil || truncated {
		t.Fatalf("an unknown partition: %v %v", ev, truncated)
	}
}
