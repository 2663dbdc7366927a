package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// Usage as vLLM reports it: cached tokens only with
// --enable-prompt-tokens-details (and only when there are some), a
// stream's usage chunk only when asked for or forced.

// streamChunks posts a streamed completion and returns its chunks.
func streamChunks(t *testing.T, f *Fleet, body map[string]any) []completion {
	t.Helper()
	res, err := http.Post(f.url(1)+"/v1/completions", "application/json", strings.NewReader(mustJSON(t, with(body, "stream", true))))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	return readSSE(t, res)
}

func TestUsageChunkOnlyWhenAsked(t *testing.T) {
	f := newTestFleet(t, nil)
	body := map[string]any{"prompt": tokenRange(1, 20), "max_tokens": 3}
	if chunks := streamChunks(t, f, body); len(chunks) != 3 || chunks[2].Usage != nil {
		t.Fatalf("without include_usage: %d chunks, last %+v", len(chunks), chunks[len(chunks)-1])
	}
	if chunks := streamChunks(t, f, with(body, "stream_options", map[string]any{"include_usage": false})); len(chunks) != 3 {
		t.Fatalf("include_usage false: %d chunks", len(chunks))
	}
	chunks := streamChunks(t, f, with(body, "stream_options", map[string]any{"include_usage": true}))
	if len(chunks) != 4 || chunks[3].Usage == nil || chunks[3].Usage.PromptTokens != 20 {
		t.Fatalf("include_usage: %d chunks, last %+v", len(chunks), chunks[len(chunks)-1])
	}

	forced := newTestFleet(t, func(c *Config) { c.EnableForceIncludeUsage = true })
	if chunks := streamChunks(t, forced, body); len(chunks) != 4 || chunks[3].Usage == nil {
		t.Fatalf("--enable-force-include-usage: %d chunks", len(chunks))
	}
}

func TestCachedTokensOnlyWithPromptTokensDetails(t *testing.T) {
	off := newTestFleet(t, func(c *Config) { c.EnablePromptTokensDetails = false })
	p := map[string]any{"prompt": tokenRange(1, 40), "max_tokens": 1}
	mustPost(t, off.url(1)+"/v1/completions", p)
	// vLLM writes the field as null when it has no details.
	if b := string(mustPost(t, off.url(1)+"/v1/completions", p)); !strings.Contains(b, `"prompt_tokens_details":null`) {
		t.Fatalf("without the flag: %s", b)
	}
	res, err := http.Post(off.url(1)+"/v1/completions", "application/json",
		strings.NewReader(mustJSON(t, with(p, "stream", true, "stream_options", map[string]any{"include_usage": true}))))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(raw), `"usage":{`) || strings.Contains(string(raw), "prompt_tokens_details") {
		t.Fatalf("stream without the flag: %s", raw)
	}

	on := newTestFleet(t, nil) // the tests' fleet has the flag on
	// Nothing cached: vLLM leaves the details out (it tests the count for
	// truth), null in a whole answer and absent from a stream's usage.
	if b := string(mustPost(t, on.url(1)+"/v1/completions", p)); !strings.Contains(b, `"prompt_tokens_details":null`) {
		t.Fatalf("cold request: %s", b)
	}
	if b := string(mustPost(t, on.url(1)+"/v1/completions", p)); !strings.Contains(b, `"prompt_tokens_details":{"cached_tokens":32}`) {
		t.Fatalf("warm request: %s", b)
	}
	chunks := streamChunks(t, on, with(p, "stream_options", map[string]any{"include_usage": true}))
	if u := chunks[len(chunks)-1].Usage; u == nil || u.PromptTokensDetails.CachedTokens != 32 {
		t.Fatalf("warm stream usage %+v", u)
	}
}
