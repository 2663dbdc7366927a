package fidelity

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// Workers of one model can be started with different contexts
// (max_model_len), and vLLM refuses, with a 400, a request that does not
// fit its own. Here worker 1 takes 4,096 tokens and worker 2 65,536. A
// conversation whose first turn worker 1 served grows past 4,096 tokens:
// its cached prefix drew every later turn back to worker 1, which refused
// each (the proxy does not fail over on a 400). A request now goes only
// to workers whose context fits it.
func TestLongPromptsGoWhereTheirContextFits(t *testing.T) {
	g := startGateway(t)
	f := startFleet(t, g, 2, true, "--max-model-len-of", "1=4096,2=65536")

	// A conversation's turns: the same first tokens, more of them each
	// turn; seed keeps conversations apart.
	turn := func(seed, n int) []int {
		ids := make([]int, n)
		for i := range ids {
			ids[i] = 1000 + (seed*7919+i)%30000
		}
		return ids
	}
	// The first turn straight to worker 1, as a client would find it had
	// been served; its KV events tell the gateway what worker 1 holds.
	firstOnWorker1 := func(seed int) {
		t.Helper()
		res := postTo(t, g.workerEndpoint(t, 1)+"/v1/completions", map[string]any{"model": model, "prompt": turn(seed, 3000), "max_tokens": 2})
		if res.StatusCode != http.StatusOK {
			t.Fatalf("the first turn on worker 1: %d", res.StatusCode)
		}
		g.settle(t, f)
	}
	served := func(a answer) string { return a.header.Get("X-Kvmock-Worker") }

	firstOnWorker1(1)
	for i := range 3 {
		a := g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": turn(1, 5000), "max_tokens": 2})
		if a.status != http.StatusOK || served(a) != "2" {
			t.Fatalf("a 5,000-token turn, send %d: %d on worker %s, want 200 on worker 2 (X-KVRouter-Cached-Tokens %s): %s",
				i, a.status, served(a), a.header.Get("X-Kvrouter-Cached-Tokens"), a.body)
		}
	}

	firstOnWorker1(2)
	// What fits both goes by its cache.
	a := g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": turn(2, 3500), "max_tokens": 2})
	if a.status != http.StatusOK || served(a) != "1" {
		t.Errorf("a 3,500-token turn: %d on worker %s, want 200 on worker 1, which holds its prefix", a.status, served(a))
	}
	// A request whose answer would not fit worker 1 goes to worker 2.
	a = g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": turn(2, 3500), "max_tokens": 1000})
	if a.status != http.StatusOK || served(a) != "2" {
		t.Errorf("a 3,500-token turn with max_tokens 1000: %d on worker %s, want 200 on worker 2", a.status, served(a))
	}

	// Without max_tokens, vLLM's completions set 16 aside: 4,085 tokens
	// do not fit 4,096 then; with max_tokens null they do.
	firstOnWorker1(3)
	a = g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": turn(3, 4085)})
	if a.status != http.StatusOK || served(a) != "2" {
		t.Errorf("a 4,085-token turn without max_tokens: %d on worker %s, want 200 on worker 2 (%s)", a.status, served(a), a.body)
	}
	firstOnWorker1(4)
	a = g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": turn(4, 4085), "max_tokens": nil})
	if a.status != http.StatusOK || served(a) != "1" {
		t.Errorf("a 4,085-token turn with max_tokens null: %d on worker %s, want 200 on worker 1, which holds its prefix", a.status, served(a))
	}
	// A text prompt, which the gateway has the worker's /tokenize count:
	// the answer was bounded by the shortest context, so a conversation
	// past it was routed by load, to either worker.
	text := words("ctx", 1500)
	res := postTo(t, g.workerEndpoint(t, 1)+"/v1/completions", map[string]any{"model": model, "prompt": text, "max_tokens": 2})
	if res.StatusCode != http.StatusOK {
		t.Fatalf("the first text turn on worker 1: %d", res.StatusCode)
	}
	g.settle(t, f)
	for i := range 3 {
		a = g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": text + " " + words("more", 3000+i), "max_tokens": 2})
		if a.status != http.StatusOK || served(a) != "2" {
			t.Fatalf("a long text turn, send %d: %d on worker %s, want 200 on worker 2 (%s)", i, a.status, served(a), a.body)
		}
		if a.usage.PromptTokens <= 4096 {
			t.Fatalf("the long text turn is %d tokens: not past worker 1's context", a.usage.PromptTokens)
		}
	}
	// A request that asks for its prompt's logprobs reads no cache, and is
	// routed by load: by load among the workers its ids fit (it went to
	// either, and worker 1 refused it).
	for i := range 4 {
		a = g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": turn(5, 5000+i), "max_tokens": 2, "prompt_logprobs": 1})
		if a.status != http.StatusOK || served(a) != "2" {
			t.Fatalf("a 5,000-token prompt with prompt_logprobs, send %d: %d on worker %s, want 200 on worker 2 (%s)", i, a.status, served(a), a.body)
		}
	}
	// The same for a text prompt, which a worker's /tokenize counts, only
	// for its length: it went to either.
	for i := range 3 {
		a = g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": words("lp", 4500+i), "max_tokens": 2, "prompt_logprobs": 1})
		if a.status != http.StatusOK || served(a) != "2" || a.usage.PromptTokens <= 4096 {
			t.Fatalf("a %d-token text with prompt_logprobs, send %d: %d on worker %s, want 200 on worker 2 (%s)", a.usage.PromptTokens, i, a.status, served(a), a.body)
		}
	}
	// A text past every context, cut by truncate_prompt_tokens to fit
	// worker 2's: /tokenize does not cut, and its answer was cut off at
	// the longest context, the request counted over and sent anywhere.
	for i := range 2 {
		a = g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": words("cut", 70000+i), "max_tokens": 2, "truncate_prompt_tokens": 5000})
		if a.status != http.StatusOK || served(a) != "2" || a.usage.PromptTokens != 5000 {
			t.Fatalf("a text past every context cut to 5,000 tokens, send %d: %d on worker %s (%d tokens), want 200 on worker 2 (%s)", i, a.status, served(a), a.usage.PromptTokens, a.body)
		}
	}
	// The operator sees the turns the filter narrowed: three at 5,000
	// tokens, one with max_tokens 1000, one without max_tokens, three
	// long texts, four with prompt_logprobs and three texts with them,
	// two cut texts.
	if want := `kvrouter_context_filtered_total{model="default",outcome="narrowed"} 17`; !strings.Contains(g.metrics(t), want) {
		t.Errorf("no %s in the metrics", want)
	}
}

// TestLongGeneratesGoWhereTheirContextFits: SGLang's /generate bounds its
// answer with sampling_params.max_new_tokens, and SGLang refuses a prompt
// and answer that reach its context. The gateway read no answer length on
// /generate, so a long one was drawn to the worker holding its prefix,
// which refused it.
func TestLongGeneratesGoWhereTheirContextFits(t *testing.T) {
	g := startGateway(t)
	f := startFleet(t, g, 2, true, "--api", "sglang", "--max-model-len-of", "1=4096,2=65536")
	ids := func(n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = 2000 + i%30000
		}
		return out
	}
	res := postTo(t, g.workerEndpoint(t, 1)+"/generate", map[string]any{"input_ids": ids(3000), "sampling_params": map[string]any{"max_new_tokens": 2}})
	if res.StatusCode != http.StatusOK {
		t.Fatalf("the first request on worker 1: %d", res.StatusCode)
	}
	g.settle(t, f)
	for _, tc := range []struct {
		maxNew int
		want   string
	}{
		{2, "1"}, // fits worker 1, which holds its prefix
		{995, "1"},
		{996, "2"},  // 3,100 + 996 reaches 4,096: SGLang refuses it
		{2000, "2"}, // 3,100 + 2,000 does not fit 4,096
	} {
		a := g.post(t, "/generate", map[string]any{"input_ids": ids(3100), "sampling_params": map[string]any{"max_new_tokens": tc.maxNew}})
		if a.status != http.StatusOK || a.header.Get("X-Kvmock-Worker") != tc.want {
			t.Errorf("3,100 ids, max_new_tokens %d: %d on worker %s, want 200 on worker %s (%s)", tc.maxNew, a.status, a.header.Get("X-Kvmock-Worker"), tc.want, a.body)
		}
	}
}

// workerEndpoint is worker id's base URL, from the gateway's catalog.
func (g *gateway) workerEndpoint(t *testing.T, id uint64) string {
	t.Helper()
	var list struct {
		Workers []struct {
			WorkerID uint64 `json:"worker_id"`
			Endpoint string `json:"endpoint"`
		} `json:"workers"`
	}
	getJSON(t, g.api+"/ready", &list)
	for _, w := range list.Workers {
		if w.WorkerID == id {
			return "http://" + w.Endpoint
		}
	}
	t.Fatalf("no worker %d in the catalog", id)
	return ""
}

// postTo sends body as JSON to url.
func postTo(t *testing.T, url string, body any) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	res, err := client.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res
}
