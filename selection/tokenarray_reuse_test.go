package selection

import (
	"slices"
	"testing"
	"unsafe"
)

// TestTokenArrayReusedSlice decodes the same long body into reused token
// slices of every kind of capacity: none (sized from the commas up
// front), too small by any amount (filled, then sized once when it runs
// short), and enough (filled in place, never reallocated). Every one must
// give the tokens of a fresh decode, and a slice that grew must have grown
// once, to the array's length (its commas plus one), not by append's
// doubling.
func TestTokenArrayReusedSlice(t *testing.T) {
	body := selectBody(5_000)
	var fresh SelectRequest
	if err := DecodeJSON(body, &fresh); err != nil {
		t.Fatal(err)
	}
	for _, c := range []int{1, 5, 31, 32, 33, 100, 4_967, 4_968, 4_999, 5_000, 5_001, 20_000} {
		req := SelectRequest{}
		req.TokenIDs = make([]uint32, 3, c+3)[3:] // capacity c, with stale elements before it
		before := unsafe.SliceData(req.TokenIDs)
		if err := DecodeJSON(body, &req); err != nil {
			t.Fatalf("capacity %d: %v", c, err)
		}
		if !slices.Equal(req.TokenIDs, fresh.TokenIDs) {
			t.Fatalf("capacity %d: tokens differ from a fresh decode", c)
		}
		grew := unsafe.SliceData(req.TokenIDs) != before
		if c >= len(fresh.TokenIDs) && grew {
			t.Fatalf("capacity %d: reallocated a slice with room for %d tokens", c, len(fresh.TokenIDs))
		}
		if grew && cap(req.TokenIDs) != len(req.TokenIDs) {
			t.Fatalf("capacity %d: grew to %d for %d tokens, not once to the commas' bound", c, cap(req.TokenIDs), len(req.TokenIDs))
		}
	}
}
