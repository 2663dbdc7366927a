package main

import (
	"net/http"
	"strconv"
	"strings"
)

// GET /metrics in the Prometheus text format with vLLM's metric names, so
// that tools that scrape vLLM (load-aware routers, dashboards) work against
// the simulation. Each engine (DP rank) is one series, labelled as vLLM
// labels them: model_name and engine. vllm:cache_config_info is the
// exception, as in vLLM: an info gauge of value 1 whose labels are the
// engine's cache config as strings, and engine, with no model_name.

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
	b = w.appendCacheConfigInfo(b)
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

// cacheConfigLabels are vllm:cache_config_info's labels of one engine, in
// the order vLLM writes its CacheConfig's fields, each value as Python's
// str() writes it. What kvmock has no notion of carries vLLM's default.
// prefix_caching_hash_algo says sha256 though kvmock hashes with FNV: both
// tell a gateway the same, that it cannot reproduce the engine's hashes
// and must key by the events' token ids.
func (c *Config) cacheConfigLabels(dpRank int) [][2]string {
	return [][2]string{
		{"block_size", strconv.Itoa(c.BlockSize)},
		{"gpu_memory_utilization", "0.9"},
		{"swap_space", "4"},
		{"cache_dtype", "auto"},
		{"is_attention_free", "False"},
		{"num_gpu_blocks_override", "None"},
		{"sliding_window", "None"},
		{"enable_prefix_caching", "True"},
		{"prefix_caching_hash_algo", "sha256"},
		{"cpu_offload_gb", "0"},
		{"calculate_kv_scales", "False"},
		{"kv_sharing_fast_prefill", "False"},
		{"mamba_page_size_padded", "None"},
		{"num_gpu_blocks", strconv.Itoa(c.KVBlocks)},
		{"num_cpu_blocks", "None"},
		{"engine", strconv.Itoa(dpRank)},
	}
}

// appendCacheConfigInfo appends the vllm:cache_config_info family.
func (w *worker) appendCacheConfigInfo(b []byte) []byte {
	const name = "vllm:cache_config_info"
	b = append(b, "# HELP "+name+" Information of the LLMEngine CacheConfig\n# TYPE "+name+" gauge\n"...)
	for _, e := range w.engines {
		b = append(b, name+"{"...)
		for i, l := range w.cfg.cacheConfigLabels(e.dpRank) {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, l[0]+`="`+promEscape(l[1])+`"`...)
		}
		b = append(b, "} 1\n"...)
	}
	return b
}
