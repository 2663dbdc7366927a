package selection_test

import (
	"fmt"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// The embedded mode: a Go program (a Ray-style router, say) uses the same
// calls as the HTTP API, without HTTP.
func ExampleNewRouter() {
	cfg := selection.DefaultConfig()
	cfg.UseKVEvents = false // learn prefixes from bookings
	r, err := selection.NewRouter(cfg)
	if err != nil {
		panic(err)
	}
	defer r.Close()

	// Workers are registered in the router's catalog, as POST /workers does.
	catalog := r.Catalog()
	for id := uint64(1); id <= 2; id++ {
		ep := fmt.Sprintf("10.0.0.%d:8000", id)
		bs := uint32(4)
		if _, err := catalog.UpsertWorker(&selection.WorkerRequest{WorkerID: &id, Endpoint: &ep, BlockSize: &bs}); err != nil {
			panic(err)
		}
	}
	prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	first, _ := r.SelectAndReserve(&selection.SelectRequest{SelectionID: "req-1", Prompt: selection.Prompt{TokenIDs: prompt}})
	r.Health().ReportStatus(first.WorkerID, 200) // the worker answered
	_ = r.PrefillComplete("req-1")               // first token streamed
	_ = r.Free("req-1")                          // response finished

	// The same prefix, longer: it goes where the prefix is cached.
	next, _ := r.Select(&selection.SelectRequest{Prompt: selection.Prompt{TokenIDs: append(prompt, 9, 10, 11, 12)}})
	fmt.Println(next.WorkerID == first.WorkerID, next.Overlap.GPU, next.EffectivePrefillTokens)
	// Output: true 8 4
}
