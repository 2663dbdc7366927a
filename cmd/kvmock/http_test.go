package main

import (
	"bufio"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSharedPrefixIsCachedAndFaster(t *testing.T) {
	f := newTestFleet(t, nil)
	prefix := tokenRange(1000, 1024) // 1024 tokens at 10,000/s: about 100 ms of prefill
	first, cold := complete(t, f, 1, prefix, 1)
	if got := first.Usage.PromptTokensDetails.CachedTokens; got != 0 {
		t.Fatalf("cold request: cached_tokens = %d", got)
	}
	if cold < 100*time.Millisecond {
		t.Fatalf("cold request took %v, want at least the 102 ms of prefill", cold)
	}
	second, warm := complete(t, f, 1, append(slices.Clone(prefix), tokenRange(5000, 40)...), 1)
	u := second.Usage
	if u.PromptTokensDetails.CachedTokens != 1024 || u.PromptTokens != 1064 || u.CompletionTokens != 1 || u.TotalTokens != 1065 {
		t.Fatalf("warm request usage = %+v, want 1024 of 1064 prompt tokens cached", *u)
	}
	if warm > cold/2 {
		t.Fatalf("warm request took %v, cold %v: the cached prefix saved too little", warm, cold)
	}
	// Another worker has its own cache.
	other, _ := complete(t, f, 2, prefix, 1)
	if got := other.Usage.PromptTokensDetails.CachedTokens; got != 0 {
		t.Fatalf("worker 2: cached_tokens = %d, want 0", got)
	}
}

func TestFullyCachedPromptStillComputesItsLastToken(t *testing.T) {
	f := newTestFleet(t, nil)
	p := tokenRange(1, 64) // exactly four blocks
	complete(t, f, 1, p, 1)
	c, _ := complete(t, f, 1, p, 1)
	// As in vLLM, the last token is always computed, so the last block
	// cannot count as a hit.
	if got := c.Usage.PromptTokensDetails.CachedTokens; got != 48 {
		t.Fatalf("cached_tokens = %d, want 48", got)
	}
}

func TestTextAndTokenPromptsAgree(t *testing.T) {
	f := newTestFleet(t, nil)
	text := words("w", 40)
	res, b := postJSON(t, f.url(1)+"/tokenize", map[string]any{"model": "default", "prompt": text})
	if res.StatusCode != http.StatusOK {
		t.Fatalf("tokenize: %d %s", res.StatusCode, b)
	}
	var tok struct {
		Tokens      []uint32 `json:"tokens"`
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
	}
	if err := json.Unmarshal(b, &tok); err != nil {
		t.Fatal(err)
	}
	// The completion form adds the BOS token by default, as vLLM's does.
	if tok.Count != 41 || len(tok.Tokens) != 41 || tok.Tokens[0] != tokBOS || tok.MaxModelLen != 131072 {
		t.Fatalf("tokenize answer %s", b)
	}
	// A text prompt and its tokens (through the token_ids extension) are the
	// same prompt, so the second one hits what the first cached.
	res, b = postJSON(t, f.url(1)+"/v1/completions", map[string]any{"prompt": text, "max_tokens": 1})
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", res.StatusCode, b)
	}
	res, b = postJSON(t, f.url(1)+"/v1/completions", map[string]any{"token_ids": tok.Tokens, "max_tokens": 1})
	var c completion
	if err := json.Unmarshal(b, &c); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", res.StatusCode, b)
	}
	if c.Usage.PromptTokens != 41 || c.Usage.PromptTokensDetails.CachedTokens != 32 {
		t.Fatalf("usage %+v, want 32 of 41 tokens cached", *c.Usage)
	}
}

func TestTokenizeIsDeterministicAcrossWorkers(t *testing.T) {
	f := newTestFleet(t, nil)
	bodies := []map[string]any{
		{"prompt": "The quick  brown fox\njumps"},
		{"messages": []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}}},
	}
	for _, body := range bodies {
		var answers []string
		for id := 1; id <= 2; id++ {
			for range 2 {
				res, b := postJSON(t, f.url(id)+"/tokenize", body)
				if res.StatusCode != http.StatusOK {
					t.Fatalf("%d %s", res.StatusCode, b)
				}
				answers = append(answers, string(b))
			}
		}
		for _, a := range answers[1:] {
			if a != answers[0] {
				t.Fatalf("tokenize answers differ: %s vs %s", answers[0], a)
			}
		}
	}
	if got := tokenize(nil, "The quick  brown fox\njumps"); len(got) != 5 || got[0] != wordToken("The") {
		t.Fatalf("tokenize = %v", got)
	}
}

func TestChatTokensMatchTokenize(t *testing.T) {
	f := newTestFleet(t, nil)
	msgs := []map[string]any{
		{"role": "user", "content": []map[string]any{{"type": "text", "text": words("u", 30)}}},
	}
	_, b := postJSON(t, f.url(1)+"/tokenize", map[string]any{"messages": msgs})
	var tok struct {
		Count int `json:"count"`
	}
	_ = json.Unmarshal(b, &tok)
	res, b := postJSON(t, f.url(1)+"/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 3})
	var c completion
	if err := json.Unmarshal(b, &c); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", res.StatusCode, b)
	}
	// The system block the template always writes (15 tokens), the user
	// message (header, 30 words, end of turn: 34) and the generation
	// prompt (3).
	if c.Usage.PromptTokens != tok.Count || tok.Count != 52 {
		t.Fatalf("chat prompt_tokens %d, /tokenize count %d, want 52", c.Usage.PromptTokens, tok.Count)
	}
	if c.Choices[0].Message.Content != " the cache is" || c.Choices[0].FinishReason != "length" {
		t.Fatalf("chat answer %s", b)
	}
	// The next turn extends the conversation, so its prompt starts with the
	// first turn's tokens and hits their blocks.
	msgs = append(msgs, map[string]any{"role": "assistant", "content": "the cache is"},
		map[string]any{"role": "user", "content": "and then?"})
	_, b = postJSON(t, f.url(1)+"/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 1})
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if c.Usage.PromptTokensDetails.CachedTokens != 48 {
		t.Fatalf("second turn: %s", b)
	}
}

// readSSE reads server-sent events until [DONE].
func readSSE(t *testing.T, res *http.Response) []completion {
	t.Helper()
	var out []completion
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("SSE line %q", line)
		}
		if data == "[DONE]" {
			for sc.Scan() {
				if sc.Text() != "" {
					t.Fatalf("data after [DONE]: %q", sc.Text())
				}
			}
			return out
		}
		var c completion
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("%v: %s", err, data)
		}
		out = append(out, c)
	}
	t.Fatalf("stream ended without [DONE]: %v", sc.Err())
	return nil
}

func TestStreaming(t *testing.T) {
	f := newTestFleet(t, nil)
	for _, chat := range []bool{false, true} {
		usage := map[string]any{"include_usage": true}
		path, body := "/v1/completions", map[string]any{"prompt": words("s", 20), "max_tokens": 5, "stream": true, "stream_options": usage}
		if chat {
			path = "/v1/chat/completions"
			body = map[string]any{"messages": []map[string]any{{"role": "user", "content": words("s", 20)}}, "max_tokens": 5,
				"stream": true, "stream_options": usage}
		}
		res, err := http.Post(f.url(2)+path, "application/json", strings.NewReader(mustJSON(t, body)))
		if err != nil {
			t.Fatal(err)
		}
		if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" || res.Header.Get("X-Kvmock-Worker") != "2" {
			t.Fatalf("headers %v", res.Header)
		}
		chunks := readSSE(t, res)
		res.Body.Close()
		if len(chunks) != 6 {
			t.Fatalf("chat=%v: %d chunks, want 5 tokens and a usage chunk", chat, len(chunks))
		}
		var text strings.Builder
		for i, c := range chunks[:5] {
			if len(c.Choices) != 1 || c.Usage != nil {
				t.Fatalf("chunk %d: %+v", i, c)
			}
			ch := c.Choices[0]
			text.WriteString(ch.Text + ch.Delta.Content)
			if want := map[bool]string{true: "length", false: ""}[i == 4]; ch.FinishReason != want {
				t.Fatalf("chunk %d finish_reason %q", i, ch.FinishReason)
			}
			if chat && (i == 0) != (ch.Delta.Role == "assistant") {
				t.Fatalf("chunk %d role %q", i, ch.Delta.Role)
			}
		}
		if text.String() != " the cache is warm and" {
			t.Fatalf("streamed text %q", text.String())
		}
		last := chunks[5]
		if len(last.Choices) != 0 || last.Usage == nil || last.Usage.CompletionTokens != 5 {
			t.Fatalf("usage chunk %+v", last)
		}
		wantPrompt := 21 // BOS and 20 words
		if chat {
			wantPrompt = 15 + 24 + 3 // system block, user message, generation prompt
		}
		if last.Usage.PromptTokens != wantPrompt || last.Usage.TotalTokens != wantPrompt+5 {
			t.Fatalf("usage %+v", *last.Usage)
		}
	}
}

func TestStreamFirstChunkComesAfterPrefill(t *testing.T) {
	f := newTestFleet(t, func(c *Config) { c.DecodeTime = 20 * time.Millisecond })
	start := time.Now()
	res, err := http.Post(f.url(1)+"/v1/completions", "application/json",
		strings.NewReader(mustJSON(t, map[string]any{"prompt": tokenRange(1, 1000), "max_tokens": 4, "stream": true})))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	headers := time.Since(start)
	readSSE(t, res)
	total := time.Since(start)
	// 1000 tokens at 10,000/s plus a 20 ms sampling step come before the
	// headers; three more 20 ms steps come after.
	if headers < 115*time.Millisecond || total-headers < 55*time.Millisecond {
		t.Fatalf("headers after %v, stream done after %v", headers, total)
	}
}

func TestChunkedPrefillOfALongPrompt(t *testing.T) {
	f := newTestFleet(t, func(c *Config) { c.MaxBatchedTokens = 256 })
	_, took := complete(t, f, 1, tokenRange(1, 2000), 1)
	// Eight steps of at most 256 tokens; the time is the same as one step of
	// 2000 tokens would take (200 ms), plus the floor and sampling.
	if took < 200*time.Millisecond || took > 600*time.Millisecond {
		t.Fatalf("took %v", took)
	}
}

func TestConcurrentRequestsShareSteps(t *testing.T) {
	f := newTestFleet(t, func(c *Config) { c.DecodeTime = 10 * time.Millisecond })
	start := time.Now()
	done := make(chan time.Duration, 4)
	for i := range 4 {
		go func() {
			res, err := http.Post(f.url(1)+"/v1/completions", "application/json",
				strings.NewReader(mustJSON(t, map[string]any{"prompt": tokenRange(i*100, 16), "max_tokens": 20})))
			if err == nil {
				res.Body.Close()
			}
			done <- time.Since(start)
		}()
	}
	var slowest time.Duration
	for range 4 {
		slowest = max(slowest, <-done)
	}
	// Batched decoding: four requests of twenty tokens take about twenty
	// steps (200 ms), not eighty.
	if slowest > 600*time.Millisecond {
		t.Fatalf("four concurrent requests took %v", slowest)
	}
}

func TestBadRequests(t *testing.T) {
	f := newTestFleet(t, func(c *Config) { c.KVBlocks = 8; c.MaxModelLen = 200 })
	cases := []struct {
		body   string
		status int
	}{
		{`{"prompt": "a b", "model": "other"}`, http.StatusNotFound},
		{`{"prompt": "", "add_special_tokens": false}`, http.StatusBadRequest},
		{`{"prompt": "", "max_tokens": 1}`, http.StatusOK}, // the BOS token alone, as in vLLM
		{`{"prompt": "a", "stream_options": {"include_usage": true}}`, http.StatusBadRequest},
		{`{}`, http.StatusBadRequest},
		{`{"prompt": [[1,2],[3]]}`, http.StatusBadRequest},
		{`{"prompt": "a b", "max_tokens": 0}`, http.StatusBadRequest},
		{`{"prompt": {"x": 1}}`, http.StatusBadRequest},
		{`not json`, http.StatusBadRequest},
		{mustJSON(t, map[string]any{"prompt": tokenRange(1, 199), "max_tokens": 2}), http.StatusBadRequest}, // past max_model_len
		{mustJSON(t, map[string]any{"prompt": tokenRange(1, 150), "max_tokens": 1}), http.StatusBadRequest}, // more blocks than the cache
		{`{"prompt": [["batch", "of"]]}`, http.StatusBadRequest},
		{`{"prompt": ["one text"], "model": "default", "max_tokens": 1}`, http.StatusOK},
		{`{"prompt": [[5, 6, 7]], "max_tokens": 1}`, http.StatusOK},
	}
	for _, c := range cases {
		res, b := postJSON(t, f.url(1)+"/v1/completions", c.body)
		if res.StatusCode != c.status {
			t.Errorf("%s: %d %s, want %d", c.body, res.StatusCode, b, c.status)
		}
		if c.status != http.StatusOK && !strings.Contains(string(b), `"object":"error"`) {
			t.Errorf("%s: error body %s", c.body, b)
		}
	}
}

func TestMetricsAndHealth(t *testing.T) {
	f := newTestFleet(t, nil)
	complete(t, f, 1, tokenRange(1, 40), 1)
	complete(t, f, 1, tokenRange(1, 40), 1)
	if status, _ := get(t, f.url(1)+"/health"); status != http.StatusOK {
		t.Fatalf("/health: %d", status)
	}
	status, body := get(t, f.url(1)+"/metrics")
	if status != http.StatusOK {
		t.Fatalf("/metrics: %d", status)
	}
	for _, want := range []string{
		"# TYPE vllm:num_requests_running gauge",
		`vllm:num_requests_running{engine="0",model_name="default"} 0`,
		`vllm:num_requests_waiting{engine="0",model_name="default"} 0`,
		`vllm:kv_cache_usage_perc{engine="0",model_name="default"} 0`,
		`vllm:gpu_cache_usage_perc{engine="0",model_name="default"} 0`,
		"# TYPE vllm:prefix_cache_queries_total counter",
		`vllm:prefix_cache_queries_total{engine="0",model_name="default"} 80`,
		`vllm:prefix_cache_hits_total{engine="0",model_name="default"} 32`,
		`vllm:request_success_total{engine="0",model_name="default"} 2`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
	if status, body := get(t, f.url(1)+"/v1/models"); status != http.StatusOK || !strings.Contains(body, `"id":"default"`) {
		t.Fatalf("/v1/models: %d %s", status, body)
	}
}

func TestClientDisconnectFreesTheRequest(t *testing.T) {
	f := newTestFleet(t, func(c *Config) { c.DecodeTime = 10 * time.Millisecond })
	res, err := http.Post(f.url(1)+"/v1/completions", "application/json",
		strings.NewReader(mustJSON(t, map[string]any{"prompt": tokenRange(1, 32), "max_tokens": 1000, "stream": true})))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 10)
	if _, err := res.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	e := f.workers[0].engines[0]
	deadline := time.Now().Add(2 * time.Second)
	for e.stats.running.Load() != 0 || e.stats.usedBlocks.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("running %d, used blocks %d after the client left", e.stats.running.Load(), e.stats.usedBlocks.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
