package main

import (
	"net/http"
	"strconv"
	"strings"
)

// GET /metrics in the Prometheus text format with vLLM's metric names, so
// that tools that scrape vLLM (load-aware routers, dashboards) work against
// the simulation. Each engine (DP rank) is one series, labelled as vLLM
// labels them: model_name and engine.

// metric is one family: its name, type, help and how to read an engine.
type metric struct {
	name, typ, help string
	value           func(e *engine) float64
}

// metrics are the families served, in order.
var metrics = []metric{
	{"vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
		func(e *engine) float64 { return float64(e.stats.running.Load()) }},
	{"vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
		func(e *engine) float64 { return float64(e.stats.waiting.Load()) }},
	{"vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
		func(e *engine) float64 { return e.usage() }},
	// The name vLLM used before kv_cache_usage_perc; some routers still read it.
	{"vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent usage.",
		func(e *engine) float64 { return e.usage() }},
	{"vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.",
		func(e *engine) float64 { return float64(e.stats.promptTokens.Load()) }},
	{"vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
		func(e *engine) float64 { return float64(e.stats.cachedTokens.Load()) }},
	{"vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
		func(e *engine) float64 { return float64(e.stats.promptTokens.Load()) }},
	{"vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
		func(e *engine) float64 { return float64(e.stats.genTokens.Load()) }},
	{"vllm:request_success_total", "counter", "Count of successfully processed requests.",
		func(e *engine) float64 { return float64(e.stats.served.Load()) }},
}

// handleMetrics serves GET /metrics.
func (w *worker) handleMetrics(rw http.ResponseWriter, _ *http.Request) {
	var b []byte
	labels := make([]string, len(w.engines))
	for i, e := range w.engines {
		labels[i] = `{engine="` + strconv.Itoa(e.dpRank) + `",model_name="` + promEscape(w.cfg.Model) + `"} `
	}
	for _, m := range metrics {
		b = append(b, "# HELP "+m.name+" "+m.help+"\n# TYPE "+m.name+" "+m.typ+"\n"...)
		for i, e := range w.engines {
			b = append(b, m.name...)
			b = append(b, labels[i]...)
			b = strconv.AppendFloat(b, m.value(e), 'g', -1, 64)
			b = append(b, '\n')
		}
	}
	rw.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = rw.Write(b)
}

// promEscape escapes a label value.
func promEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}
