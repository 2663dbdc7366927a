package caddymodule

import (
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// routerWith is a router without KV events, set as tune says (nil: the
// defaults), holding the workers given; it is closed when the test ends.
func routerWith(tb testing.TB, tune func(*selection.Config), workers ...selection.WorkerRequest) *selection.Router {
	tb.Helper()
	cfg := selection.DefaultConfig()
	cfg.UseKVEvents = false
	if tune != nil {
		tune(&cfg)
	}
	router, err := selection.NewRouter(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(router.Close)
	for i := range workers {
		if _, err := router.Catalog().UpsertWorker(&workers[i]); err != nil {
			tb.Fatal(err)
		}
	}
	return router
}
