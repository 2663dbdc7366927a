package selection

import "testing"

// A prompt whose blocks a request booked ahead of it on the rank holds is
// expected cached when the engine admits it, though the index does not
// have those blocks yet: the engine prefills, and caches, the first one
// before it admits the second.
func TestExpectedCachedCountsPromptsInFlight(t *testing.T) {
	cfg := DefaultConfig()
	r, err := NewRouter(cfg, WithIndexer(fixedIndex{})) // an event-fed index that holds nothing yet
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	addWorker(t, r, 1, func(w *WorkerRequest) { w.KVEventsEndpoint = ptr("tcp://127.0.0.1:9") })
	tokens := make([]uint32, 100) // 6 whole blocks of 16
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	first, err := r.SelectAndReserve(&SelectRequest{Prompt: Prompt{TokenIDs: tokens}})
	if err != nil {
		t.Fatal(err)
	}
	if first.CachedTokens != 0 || first.ExpectedCachedTokens != 0 {
		t.Fatalf("first: cached %d, expected %d", first.CachedTokens, first.ExpectedCachedTokens)
	}
	second, err := r.SelectAndReserve(&SelectRequest{Prompt: Prompt{TokenIDs: append(tokens[:96:96], 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7)}})
	if err != nil {
		t.Fatal(err)
	}
	if second.CachedTokens != 0 || second.ExpectedCachedTokens != 96 {
		t.Fatalf("second, behind the first: cached %d (the index has nothing), expected %d (want 96: six blocks in flight)",
			second.CachedTokens, second.ExpectedCachedTokens)
	}
	for _, id := range []string{first.SelectionID, second.SelectionID} {
		if err := r.Free(id); err != nil {
			t.Fatal(err)
		}
	}
	third, err := r.SelectAndReserve(&SelectRequest{Prompt: Prompt{TokenIDs: tokens}})
	if err != nil {
		t.Fatal(err)
	}
	if third.ExpectedCachedTokens != 0 {
		t.Fatalf("nothing in flight and nothing indexed: expected %d", third.ExpectedCachedTokens)
	}
}
