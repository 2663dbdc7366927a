package caddymodule

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestEngineFactsOptions: the options in the kv_router block, their JSON
// at the app's top level, and the negative durations refused.
func TestEngineFactsOptions(t *testing.T) {
	var a App
	err := a.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`kv_router {
		engine_facts off
		engine_facts_interval 10s
		engine_facts_timeout 2s
	}`))
	want := EngineFactsConfig{EngineFacts: ptr(false), EngineFactsInterval: caddy.Duration(10 * time.Second),
		EngineFactsTimeout: caddy.Duration(2 * time.Second)}
	if err != nil || !reflect.DeepEqual(a.EngineFactsConfig, want) {
		t.Fatalf("parsed %+v, %v", a.EngineFactsConfig, err)
	}
	if b, _ := json.Marshal(&a); !strings.Contains(string(b), `"engine_facts":false,"engine_facts_interval":10000000000,"engine_facts_timeout":2000000000`) {
		t.Errorf("JSON %s", b)
	}
	for _, bad := range []string{"engine_facts_interval -1s", "engine_facts_interval 1ms", "engine_facts_timeout -5s", "engine_facts maybe"} {
		var a App
		if err := a.UnmarshalCaddyfile(caddyfile.NewTestDispenser("kv_router {\n" + bad + "\n}")); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if r := (&EngineFactsConfig{EngineFacts: ptr(false)}).start(nil, zap.NewNop()); r != nil {
		t.Error("engine_facts off started a reader")
	}
}

// silentServer answers nothing until its client gives up or the test
// ends; asked counts its requests.
func silentServer(t *testing.T) (srv *httptest.Server, asked *atomic.Int64) {
	t.Helper()
	asked = new(atomic.Int64)
	release := make(chan struct{})
	srv = httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	return srv, asked
}

// TestEngineReaderStopsWithItsCallsInFlight: stopping the reader cancels
// an engine's call that would otherwise wait for the whole timeout, and
// waits for its goroutine.
func TestEngineReaderStopsWithItsCallsInFlight(t *testing.T) {
	srv, asked := silentServer(t)
	id := uint64(1)
	router := routerWith(t, nil, selection.WorkerRequest{WorkerID: &id, Endpoint: &srv.URL})
	reader := (&EngineFactsConfig{EngineFactsTimeout: caddy.Duration(time.Minute)}).start(router.Catalog(), zap.NewNop())
	for deadline := time.Now().Add(5 * time.Second); asked.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the engine was never asked")
		}
	}
	start := time.Now()
	reader.stop()
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("stop took %v", took)
	}
	(*engineReader)(nil).stop() // what Stop does for a config without the reader
}
