package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestEngineProbeReadsAVLLMWorker: a reading of the test worker (vLLM's
// shapes) learns its model, adapters, context length and cache config,
// prefix caching included.
func TestEngineProbeReadsAVLLMWorker(t *testing.T) {
	w := newTestWorker(t, 1)
	w.setEngine(func(e *testEngine) {
		e.model, e.adapters, e.blockSize, e.maxModelLen = "llama", []string{"sql", "chat"}, 16, 8192
	})
	r := newEngineProbe(time.Second).read(context.Background(), w.addr)
	want := selection.EngineFacts{Models: []string{"llama"}, BlockSize: 16, TotalKVBlocks: 2048, MaxModelLen: 8192,
		LoraAdapters: []string{"sql", "chat"}}
	if r.facts.PrefixCaching == nil || !*r.facts.PrefixCaching {
		t.Fatalf("prefix caching read as %v, want on", r.facts.PrefixCaching)
	}
	r.facts.PrefixCaching = nil
	if len(r.errs) != 0 || len(r.notes) != 0 || fmt.Sprint(r.facts) != fmt.Sprint(want) {
		t.Fatalf("reading %+v, want facts %+v", r, want)
	}
	w.setEngine(func(e *testEngine) { e.noPrefixCaching = true })
	if r = newEngineProbe(time.Second).read(context.Background(), w.addr); r.facts.PrefixCaching == nil || *r.facts.PrefixCaching {
		t.Fatalf("prefix caching off read as %v", r.facts.PrefixCaching)
	}
	w.setEngine(func(e *testEngine) { e.noPrefixCaching = false })
	// An engine that has not sized its cache yet reports no KV blocks.
	w.setEngine(func(e *testEngine) { e.numGPUBlocks, e.adapters = 0, nil })
	r = newEngineProbe(time.Second).read(context.Background(), "http://"+w.addr+"/")
	if len(r.errs) != 0 || r.facts.TotalKVBlocks != 0 || r.facts.BlockSize != 16 || r.facts.LoraAdapters == nil || len(r.facts.LoraAdapters) != 0 {
		t.Fatalf("unsized cache, no adapters: %+v", r)
	}
}

// TestEngineProbeBounds: what an engine sends is read within the bounds;
// a missing endpoint fails its half of the reading only.
func TestEngineProbeBounds(t *testing.T) {
	var models, metrics func(http.ResponseWriter)
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			models(rw)
		case "/metrics":
			metrics(rw)
		}
	}))
	defer srv.Close()
	read := func() engineReading { return newEngineProbe(time.Second).read(context.Background(), srv.URL) }

	// SGLang: /v1/models, but no vLLM cache gauge.
	models = func(rw http.ResponseWriter) {
		fmt.Fprint(rw, `{"object":"list","data":[{"id":"qwen","object":"model","owned_by":"sglang","root":"qwen","max_model_len":32768}]}`)
	}
	metrics = func(rw http.ResponseWriter) { fmt.Fprint(rw, "sglang:num_running_reqs{model_name=\"qwen\"} 0\n") }
	r := read()
	if r.failed() || len(r.errs) != 1 || !strings.Contains(r.errs[0].Error(), "no vllm:cache_config_info sample") ||
		!slices.Equal(r.facts.Models, []string{"qwen"}) || r.facts.MaxModelLen != 32768 || r.facts.BlockSize != 0 {
		t.Fatalf("sglang: %+v", r)
	}

	// Past the bounds: too many adapters, a name too long, an answer too big.
	var b strings.Builder
	b.WriteString(`{"data":[{"id":"m","parent":null},{"id":"` + strings.Repeat("x", selection.MaxFieldBytes+1) + `","parent":"m"}`)
	for i := range selection.MaxLoraAdapters + 3 {
		fmt.Fprintf(&b, `,{"id":"a%d","parent":"m"}`, i)
	}
	b.WriteString(`]}`)
	models = func(rw http.ResponseWriter) { fmt.Fprint(rw, b.String()) }
	metrics = func(rw http.ResponseWriter) {
		fmt.Fprint(rw, `vllm:cache_config_info{engine="0",block_size="32",note="a \"quoted\", \\ value",num_gpu_blocks="7"} 1.0`+"\n")
	}
	r = read()
	if len(r.errs) != 0 || len(r.facts.LoraAdapters) != selection.MaxLoraAdapters || len(r.notes) != 2 ||
		r.facts.BlockSize != 32 || r.facts.TotalKVBlocks != 7 {
		t.Fatalf("past the bounds: errs %v notes %v adapters %d facts %d/%d", r.errs, r.notes, len(r.facts.LoraAdapters), r.facts.BlockSize, r.facts.TotalKVBlocks)
	}
	// Figures past the catalog's bounds (2^61 made the /tokenize answer's
	// bound negative, every prompt of the model refused as too long) are
	// left out with a note; the rest of the reading stands.
	models = func(rw http.ResponseWriter) {
		fmt.Fprint(rw, `{"data":[{"id":"m","max_model_len":2305843009213693952}]}`)
	}
	metrics = func(rw http.ResponseWriter) {
		fmt.Fprint(rw, `vllm:cache_config_info{block_size="16",num_gpu_blocks="18446744073709551615"} 1.0`+"\n")
	}
	if r = read(); len(r.errs) != 0 || r.facts.MaxModelLen != 0 || r.facts.TotalKVBlocks != 0 || r.facts.BlockSize != 16 ||
		len(r.notes) != 2 || !slices.Equal(r.facts.Models, []string{"m"}) {
		t.Fatalf("figures past their bounds: errs %v notes %v facts %+v", r.errs, r.notes, r.facts)
	}
	models = func(rw http.ResponseWriter) { fmt.Fprint(rw, `{"data":[`+strings.Repeat(" ", maxModelsBytes)+`]}`) }
	metrics = func(rw http.ResponseWriter) { rw.WriteHeader(http.StatusNotFound) }
	if r = read(); !r.failed() || !strings.Contains(r.errs[0].Error(), "over 1048576 bytes") || !strings.Contains(r.errs[1].Error(), "status 404") {
		t.Fatalf("too big, and no metrics: %+v", r)
	}
	// A line past maxMetricsLine, or a label set cut short, is no reading.
	models = func(rw http.ResponseWriter) { rw.WriteHeader(http.StatusInternalServerError) }
	metrics = func(rw http.ResponseWriter) { fmt.Fprint(rw, strings.Repeat("y", maxMetricsLine+1)+"\n") }
	if r = read(); !r.failed() {
		t.Fatalf("an endless line: %+v", r)
	}
	metrics = func(rw http.ResponseWriter) { fmt.Fprint(rw, `vllm:cache_config_info{block_size="16`) }
	if r = read(); !r.failed() || !strings.Contains(r.errs[1].Error(), "unterminated") {
		t.Fatalf("a cut label set: %+v", r)
	}
}

// TestEngineProbeTimesOut: an engine that never answers costs at most the
// timeout per call.
func TestEngineProbeTimesOut(t *testing.T) {
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-block }))
	defer srv.Close()
	defer close(block)
	start := time.Now()
	r := newEngineProbe(100*time.Millisecond).read(context.Background(), srv.URL)
	if !r.failed() || time.Since(start) > 2*time.Second {
		t.Fatalf("a silent engine: %+v after %v", r, time.Since(start))
	}
}

func TestParseLabels(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want map[string]string
		err  bool
	}{
		{`}`, map[string]string{}, false},
		{`a="1",b="x\ny"} 1`, map[string]string{"a": "1", "b": "x\ny"}, false},
		{`a="\"q\"", b="\\",} 1`, map[string]string{"a": `"q"`, "b": `\`}, false},
		{`a=1}`, nil, true},
		{`="1"}`, nil, true},
		{`a="1`, nil, true},
		{`a="1"`, nil, true},
	} {
		got, err := parseLabels(tc.in)
		if (err != nil) != tc.err || !tc.err && fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("parseLabels(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}
