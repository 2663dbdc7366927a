package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// factsCaddyfile is a gateway in event mode with the selection API under
// /api/, its log (INFO, JSON) in logFile, and options (block_size, the
// engine facts' settings, workers) in its kv_router block.
func factsCaddyfile(logFile, options string) string {
	return fmt.Sprintf(`{
%s	log {
		output file %s
		format json
		level INFO
	}
	kv_router {
%s
	}
}

:%d {
	bind 127.0.0.1
	handle_path /api/* {
		kv_selection
	}
	handle {
		kv_router {
			explain on
			tokenize_timeout 2s
		}
		reverse_proxy {
			dynamic kv_router
			lb_policy kv_router
			lb_retries 2
		}
	}
}
`, testGlobals, logFile, options, testHTTPPort)
}

// waitRecord waits until worker id's record satisfies ok, and returns it.
func waitRecord(t *testing.T, id uint64, what string, ok func(*selection.WorkerRecord) bool) selection.WorkerRecord {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec, found := pooledState(t).router.Catalog().Worker(id)
		if found && ok(&rec) {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker %d: never %s: %+v", id, what, rec)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitIndexedIn waits until the index holds n entries for the worker in
// the model's default group.
func waitIndexedIn(t *testing.T, model string, id uint64, n int) {
	t.Helper()
	key := selection.PartitionKey{Model: model, Group: "default"}
	deadline := time.Now().Add(10 * time.Second)
	for pooledState(t).events.Index.Blocks(key, selection.Rank{WorkerID: id}) < n {
		if time.Now().After(deadline) {
			t.Fatalf("worker %d: the index of %s never reached %d blocks", id, model, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// logLines returns the lines of a JSON log whose message is msg.
func logLines(t *testing.T, file, msg string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for line := range strings.Lines(string(b)) {
		var entry map[string]any
		if json.Unmarshal([]byte(line), &entry) == nil && entry["msg"] == msg {
			out = append(out, entry)
		}
	}
	return out
}

// adminGet reads one of Caddy's admin routes.
func adminGet(t *testing.T, tester *testCaddy, path string) string {
	t.Helper()
	res, err := tester.Client.Get(fmt.Sprintf("http://localhost:%d%s", testAdminPort, path))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, res.StatusCode, b)
	}
	return string(b)
}

// TestEngineFactsCompleteAWorkerDeclaredByItsEndpoints: a worker
// registered with its HTTP and event endpoints alone, in a gateway with
// no default block size, waits incomplete until its engine is read; then
// it has its model, block size, KV blocks, context length and adapter,
// its events are followed, and requests for the model and the adapter
// are routed by their cached prefixes, each hashed as the engine does.
func TestEngineFactsCompleteAWorkerDeclaredByItsEndpoints(t *testing.T) {
	tester := newTester(t)
	w := newTestWorker(t, 7)
	w.setEngine(func(e *testEngine) {
		e.model, e.adapters, e.blockSize, e.numGPUBlocks, e.maxModelLen = "llama", []string{"sql"}, 16, 1000, 8192
	})
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	tester.InitServer(factsCaddyfile(logFile, ""), "caddyfile")

	var rec selection.WorkerRecord
	callJSON(t, tester, http.MethodPost, "/api/workers",
		fmt.Sprintf(`{"worker_id":7,"endpoint":%q,"kv_events_endpoint":%q}`, w.addr, w.pubEP), http.StatusCreated, &rec)
	if rec.Schedulable() || rec.ModelName != "default" || rec.BlockSize != nil {
		t.Fatalf("registered: %+v", rec)
	}
	rec = waitRecord(t, 7, "complete", func(r *selection.WorkerRecord) bool { return r.Schedulable() })
	if rec.ModelName != "llama" || *rec.BlockSize != 16 || *rec.EngineBlockSize != 16 || *rec.TotalKVBlocks != 1000 ||
		*rec.MaxModelLen != 8192 || !slices.Equal(rec.LoraAdapters, []string{"sql"}) || len(rec.LoadOnlyReasons) != 0 {
		t.Fatalf("completed: %+v", rec)
	}
	_, body := call(t, tester, http.MethodGet, "/api/workers", "", "")
	for _, want := range []string{`"model_name":"llama"`, `"lora_adapters":["sql"]`, `"max_model_len":8192`, `"engine_block_size":16`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("GET /workers lacks %s: %s", want, body)
		}
	}

	w.waitSubscribed()
	base, tuned := seqTokens(100, 64), seqTokens(700, 64)
	w.announce(base, 16)
	w.announceLora(tuned, 16, "sql")
	waitIndexedIn(t, "llama", 7, 8)
	for _, tc := range []struct {
		model  string
		tokens []uint32
		cached string
	}{
		{"llama", base, "64"}, {"sql", tuned, "64"},
		// The same tokens under the other name are other blocks.
		{"llama", tuned, "0"}, {"sql", base, "0"},
	} {
		res, text := post(t, tester, "/v1/completions", `{"model":"`+tc.model+`","prompt":`+tokensJSON(tc.tokens)+`}`)
		if res.StatusCode != 200 || res.Header.Get("X-KVRouter-Worker") != "7" || res.Header.Get("X-KVRouter-Cached-Tokens") != tc.cached {
			t.Errorf("model %s: status %d, worker %q, cached %q (want %s): %s", tc.model, res.StatusCode,
				res.Header.Get("X-KVRouter-Worker"), res.Header.Get("X-KVRouter-Cached-Tokens"), tc.cached, text)
		}
	}
	if w.servedModel("sql") != 2 || w.servedModel("llama") != 2 {
		t.Errorf("the engine answered sql %d and llama %d times, want 2 each", w.servedModel("sql"), w.servedModel("llama"))
	}
	waitNoReservations(t)
	if applied := logLines(t, logFile, "engine facts applied"); len(applied) != 1 || applied[0]["model_name"] != "llama" {
		t.Errorf("log of the facts: %v", applied)
	}
}

// TestEngineBlockSizeMismatchRoutesByLoadOnly: a worker declared with
// block size 4 whose engine runs 16 is logged once, counted in the
// metrics and routed by load only: the prefix the index holds for it
// earns it nothing, while the other worker of the model, whose engine
// agrees, is still routed by its cache.
func TestEngineBlockSizeMismatchRoutesByLoadOnly(t *testing.T) {
	tester := newTester(t)
	w1, w2 := newTestWorker(t, 1), newTestWorker(t, 2)
	w2.setEngine(func(e *testEngine) { e.blockSize = 16 })
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	tester.InitServer(factsCaddyfile(logFile, "\t\tblock_size 4\n\t\tengine_facts_interval 1s\n"+workerBlock(w1)+workerBlock(w2)), "caddyfile")
	w1.waitSubscribed()
	w2.waitSubscribed()
	rec := waitRecord(t, 2, "read", func(r *selection.WorkerRecord) bool { return r.EngineBlockSize != nil })
	if !rec.Schedulable() || *rec.BlockSize != 4 || *rec.EngineBlockSize != 16 || len(rec.LoadOnlyReasons) != 1 {
		t.Fatalf("mismatched worker: %+v", rec)
	}
	if rec := waitRecord(t, 1, "read", func(r *selection.WorkerRecord) bool { return r.EngineBlockSize != nil }); len(rec.LoadOnlyReasons) != 0 {
		t.Fatalf("matching worker: %+v", rec)
	}

	held, other := seqTokens(100, 64), seqTokens(5000, 64)
	w2.announce(held, 4)
	w1.announce(other, 4)
	waitIndexed(t, 2, 16)
	waitIndexed(t, 1, 16)
	res, _ := post(t, tester, "/v1/completions", `{"model":"m","prompt":`+tokensJSON(other)+`}`)
	if res.StatusCode != 200 || res.Header.Get("X-KVRouter-Worker") != "1" || res.Header.Get("X-KVRouter-Cached-Tokens") != "64" {
		t.Fatalf("the matching worker's prefix: status %d, worker %q, cached %q", res.StatusCode,
			res.Header.Get("X-KVRouter-Worker"), res.Header.Get("X-KVRouter-Cached-Tokens"))
	}
	for i := range 10 {
		res, _ := post(t, tester, "/v1/completions", `{"model":"m","prompt":`+tokensJSON(held)+`}`)
		if res.StatusCode != 200 || res.Header.Get("X-KVRouter-Cached-Tokens") != "0" ||
			!strings.Contains(res.Header.Get("X-KVRouter-Explain"), "2/0 overlap=0") {
			t.Fatalf("request %d for the mismatched worker's prefix: status %d, worker %q, cached %q, explain %q", i, res.StatusCode,
				res.Header.Get("X-KVRouter-Worker"), res.Header.Get("X-KVRouter-Cached-Tokens"), res.Header.Get("X-KVRouter-Explain"))
		}
	}
	waitNoReservations(t)

	metrics := adminGet(t, tester, "/metrics")
	if !strings.Contains(metrics, `kvrouter_worker_block_size_mismatch{worker_id="2"} 1`) ||
		strings.Contains(metrics, `kvrouter_worker_block_size_mismatch{worker_id="1"}`) ||
		!strings.Contains(metrics, `kvrouter_engine_facts_reads_total{outcome="ok"}`) {
		t.Errorf("metrics lack the mismatch, or name the matching worker:\n%s", grepLines(metrics, "kvrouter_engine_facts", "block_size_mismatch"))
	}
	// Read again and again (every second), warned about once.
	time.Sleep(2500 * time.Millisecond)
	warned := logLines(t, logFile, "the worker's engine runs another block size than the worker was declared with: routing it by load only, not by its cache")
	if len(warned) != 1 || warned[0]["worker_id"] != 2.0 || warned[0]["block_size"] != 4.0 || warned[0]["engine_block_size"] != 16.0 {
		t.Errorf("warnings: %v", warned)
	}
}

// grepLines returns the lines of s that contain any of words.
func grepLines(s string, words ...string) string {
	var out []string
	for line := range strings.Lines(s) {
		for _, w := range words {
			if strings.Contains(line, w) {
				out = append(out, strings.TrimSpace(line))
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
