package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// The test worker's engine, as vLLM's OpenAI server shows it: GET
// /v1/models lists the base model (with its max_model_len and the path of
// its weights as root) and a card per loaded LoRA adapter (its parent the
// base model, its root the adapter's path, no max_model_len); GET
// /metrics exposes the cache configuration as vllm:cache_config_info, an
// info gauge of value 1 whose labels are the CacheConfig's fields (with
// num_gpu_blocks "None" until the cache is sized); and a request whose
// model is neither the base model nor a loaded adapter is a 404
// NotFoundError, "The model `x` does not exist.", on the completion
// routes and /tokenize alike.

// testEngine is what a test worker serves and runs with.
type testEngine struct {
	mu           sync.Mutex
	model        string
	adapters     []string
	blockSize    int
	numGPUBlocks int // 0: not sized yet ("None")
	maxModelLen  int
	// noPrefixCaching: the engine runs with --no-enable-prefix-caching.
	noPrefixCaching bool
	byModel         map[string]int // completions answered per requested model
}

// defaultTestEngine is the engine the tests' configs declare their
// workers with: model m, block size 4.
func defaultTestEngine() testEngine {
	return testEngine{model: "m", blockSize: 4, numGPUBlocks: 2048, maxModelLen: 4096, byModel: map[string]int{}}
}

// setEngine changes the worker's engine under its lock.
func (w *testWorker) setEngine(fn func(e *testEngine)) {
	w.engine.mu.Lock()
	defer w.engine.mu.Unlock()
	fn(&w.engine)
}

// servedModel returns how many completions the worker answered for model.
func (w *testWorker) servedModel(model string) int {
	w.engine.mu.Lock()
	defer w.engine.mu.Unlock()
	return w.engine.byModel[model]
}

// serves reports whether the engine serves model: the base model, or a
// loaded adapter.
func (w *testWorker) serves(model string) bool {
	w.engine.mu.Lock()
	defer w.engine.mu.Unlock()
	return model == w.engine.model || slices.Contains(w.engine.adapters, model)
}

func (w *testWorker) countModel(model string) {
	w.engine.mu.Lock()
	defer w.engine.mu.Unlock()
	w.engine.byModel[model]++
}

// checkModel answers 404 for a request (its body restored for whoever
// reads it next) whose model the engine does not serve; a body without a
// model is the base model's.
func (w *testWorker) checkModel(rw http.ResponseWriter, r *http.Request) bool {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal(body, &req)
	if req.Model != "" && !w.serves(req.Model) {
		answerModelNotFound(rw, req.Model)
		return false
	}
	return true
}

// answerModelNotFound is vLLM's answer for a model it does not serve.
func answerModelNotFound(rw http.ResponseWriter, model string) {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": fmt.Sprintf("The model `%s` does not exist.", model), "type": "NotFoundError", "param": "model", "code": 404}})
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(http.StatusNotFound)
	_, _ = rw.Write(b)
}

// models is GET /v1/models.
func (w *testWorker) models(rw http.ResponseWriter, _ *http.Request) {
	w.engine.mu.Lock()
	e := &w.engine
	now := time.Now().Unix()
	perm := []map[string]any{{"id": "modelperm-test", "object": "model_permission", "created": now, "allow_sampling": true,
		"allow_view": true, "organization": "*", "group": nil, "is_blocking": false}}
	cards := []map[string]any{{"id": e.model, "object": "model", "created": now, "owned_by": "vllm",
		"root": "/models/" + e.model, "parent": nil, "max_model_len": e.maxModelLen, "permission": perm}}
	for _, a := range e.adapters {
		cards = append(cards, map[string]any{"id": a, "object": "model", "created": now, "owned_by": "vllm",
			"root": "/adapters/" + a, "parent": e.model, "max_model_len": nil, "permission": perm})
	}
	w.engine.mu.Unlock()
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(map[string]any{"object": "list", "data": cards})
}

// metrics is GET /metrics, a part of vLLM's exposition with the cache
// configuration among other metrics.
func (w *testWorker) metrics(rw http.ResponseWriter, _ *http.Request) {
	w.engine.mu.Lock()
	blocks := "None"
	if w.engine.numGPUBlocks > 0 {
		blocks = fmt.Sprint(w.engine.numGPUBlocks)
	}
	model, bs := w.engine.model, w.engine.blockSize
	prefixCaching := "True"
	if w.engine.noPrefixCaching {
		prefixCaching = "False"
	}
	w.engine.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "# HELP vllm:num_requests_running Number of requests in model execution batches.\n")
	fmt.Fprintf(&b, "# TYPE vllm:num_requests_running gauge\n")
	fmt.Fprintf(&b, "vllm:num_requests_running{engine=\"0\",model_name=%q} 0.0\n", model)
	fmt.Fprintf(&b, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n")
	fmt.Fprintf(&b, "# TYPE vllm:cache_config_info gauge\n")
	fmt.Fprintf(&b, "vllm:cache_config_info{block_size=\"%d\",cache_dtype=\"auto\",calculate_kv_scales=\"False\",cpu_offload_gb=\"0\","+
		"enable_prefix_caching=\"%s\",engine=\"0\",gpu_memory_utilization=\"0.9\",is_attention_free=\"False\",num_cpu_blocks=\"None\","+
		"num_gpu_blocks=\"%s\",num_gpu_blocks_override=\"None\",prefix_caching_hash_algo=\"sha256\",sliding_window=\"None\",swap_space=\"4\"} 1.0\n",
		bs, prefixCaching, blocks)
	fmt.Fprintf(&b, "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n")
	fmt.Fprintf(&b, "# TYPE vllm:kv_cache_usage_perc gauge\n")
	fmt.Fprintf(&b, "vllm:kv_cache_usage_perc{engine=\"0\",model_name=%q} 0.0\n", model)
	rw.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = io.WriteString(rw, b.String())
}
