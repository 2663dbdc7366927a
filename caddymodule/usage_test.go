package caddymodule

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
)

// Answers as vLLM writes them: a chat completion (usage followed by a few
// null fields), and a stream asked for usage (a last chunk with no
// choices before [DONE]).
const (
	vllmChatAnswer = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"hi \"usage\":{}"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":1000,"total_tokens":1010,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":992}},` +
		`"prompt_logprobs":null,"kv_transfer_params":null}`
	vllmStream = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n" +
		"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"},\"finish_reason\":\"length\"}]}\n\n" +
		"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":64,\"completion_tokens\":2,\"total_tokens\":66,\"prompt_tokens_details\":{\"cached_tokens\":48}}}\n\n" +
		"data: [DONE]\n\n"
)

func TestFindUsage(t *testing.T) {
	cached := func(n int64) *int64 { return &n }
	for _, c := range []struct {
		name   string
		body   string
		ok     bool
		prompt int64
		cached *int64
	}{
		{"json", vllmChatAnswer, true, 1000, cached(992)},
		{"stream", vllmStream, true, 64, cached(48)},
		// Servers that write "usage": null in every chunk: the last object wins.
		{"null chunks", strings.ReplaceAll(vllmStream, `"choices":[{"index":0,"delta":{"content":"b"}`, `"usage":null,"choices":[{"index":0,"delta":{"content":"b"}`), true, 64, cached(48)},
		{"no details", `{"usage":{"prompt_tokens":7,"completion_tokens":1}}`, true, 7, nil},
		{"stream without usage", "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", false, 0, nil},
		{"usage null only", `{"usage":null}`, false, 0, nil},
		{"cut", `{"usage":{"prompt_tokens":7,`, false, 0, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			u, ok := findUsage([]byte(c.body))
			if ok != c.ok || u.PromptTokens != c.prompt {
				t.Fatalf("findUsage = %+v, %v; want prompt_tokens %d, %v", u, ok, c.prompt, c.ok)
			}
			var got *int64
			if u.PromptTokensDetails != nil {
				got = u.PromptTokensDetails.CachedTokens
			}
			if (got == nil) != (c.cached == nil) || got != nil && *got != *c.cached {
				t.Fatalf("cached tokens %v, want %v", got, c.cached)
			}
		})
	}
}

// The tail keeps the last usageTailSize bytes however they were written,
// and finds the usage at the end of an answer much longer than itself.
func TestResponseTail(t *testing.T) {
	long := strings.Repeat("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n", 5000) + vllmStream
	for _, chunk := range []int{1, 7, 100, 4096, usageTailSize, len(long)} {
		var tail responseTail
		for i := 0; i < len(long); i += chunk {
			tail.write([]byte(long[i:min(i+chunk, len(long))]))
		}
		if len(tail.buf) != usageTailSize || !bytes.Equal(tail.buf, []byte(long[len(long)-usageTailSize:])) {
			t.Fatalf("chunks of %d: the tail is not the last %d bytes", chunk, usageTailSize)
		}
		if u, ok := findUsage(tail.buf); !ok || u.PromptTokens != 64 {
			t.Fatalf("chunks of %d: usage %+v %v", chunk, u, ok)
		}
	}
}

// vLLM computes a prompt's last token even when all of it is cached, so
// a fully cached, block-aligned prompt reports one block less.
func TestExpectedCached(t *testing.T) {
	for _, c := range []struct {
		prompt int
		cached uint64
		want   uint64
	}{
		{64, 64, 48},  // all cached, aligned: the last block is computed
		{65, 64, 64},  // the last token is past the cached blocks
		{64, 32, 32},  // a partial hit is what it is
		{0, 32, 32},   // routed by load: nothing to cap by
		{17, 16, 16},  // one token past a block
		{16, 16, 0},   // a one-block prompt never reports a hit
		{100, 96, 96}, // unaligned prompt, whole blocks cached
	} {
		p := prediction{promptTokens: c.prompt, cachedTokens: c.cached, blockSize: 16}
		if got := p.expectedCached(); got != c.want {
			t.Errorf("prompt %d cached %d: expected %d, want %d", c.prompt, c.cached, got, c.want)
		}
	}
}

func TestMismatchCause(t *testing.T) {
	n := func(v int64) *int64 { return &v }
	for _, c := range []struct {
		p        prediction
		prompt   int64
		reported *int64
		want     string
	}{
		{prediction{promptTokens: 100, blockSize: 16, chat: true}, 101, n(0), "special_tokens"},
		{prediction{promptTokens: 100, blockSize: 16}, 99, n(0), "special_tokens"},
		{prediction{promptTokens: 100, blockSize: 16, chat: true}, 180, n(0), "chat_template"},
		{prediction{promptTokens: 100, blockSize: 16}, 180, n(0), "tokenizer"},
		{prediction{promptTokens: 100, blockSize: 16}, 100, n(40), "block_size"},
		{prediction{promptTokens: 100, blockSize: 16}, 100, n(48), ""},
		{prediction{promptTokens: 100, blockSize: 16}, 100, nil, ""},
		{prediction{blockSize: 16}, 5000, n(0), ""}, // routed by load: no prompt to compare
	} {
		mismatch := c.p.promptTokens > 0 && c.prompt != int64(c.p.promptTokens)
		if got, _ := mismatchCause(&c.p, engineUsage{PromptTokens: c.prompt}, c.reported, mismatch); got != c.want {
			t.Errorf("%+v, engine %d/%v: cause %q, want %q", c.p, c.prompt, c.reported, got, c.want)
		}
	}
}

func TestTokenCache(t *testing.T) {
	c := newTokenCache(10 + 2*entryOverhead) // room for two answers of 4 and 4, or 4 and 3, not three
	k := func(s string) [2]uint64 { h := tokenCacheKey("m", []byte(s)); return [2]uint64{h.Hi, h.Lo} }
	if k("a") == k("b") || tokenCacheKey("m", []byte("a")) == tokenCacheKey("n", []byte("a")) {
		t.Fatal("keys collide")
	}
	c.put(tokenCacheKey("m", []byte("a")), []uint32{1, 2, 3, 4})
	c.put(tokenCacheKey("m", []byte("b")), []uint32{5, 6, 7, 8})
	if got := c.get(tokenCacheKey("m", []byte("a"))); len(got) != 4 || got[0] != 1 { // a is now the most recent
		t.Fatalf("get a = %v", got)
	}
	c.put(tokenCacheKey("m", []byte("c")), []uint32{9, 9, 9}) // 11 tokens and three entries: b, the least recent, goes
	if c.get(tokenCacheKey("m", []byte("b"))) != nil || c.get(tokenCacheKey("m", []byte("a"))) == nil || c.get(tokenCacheKey("m", []byte("c"))) == nil {
		t.Fatal("eviction did not drop the least recently used answer")
	}
	if c.tokens != 7+2*entryOverhead {
		t.Fatalf("charged %d, want 7 tokens and two entries", c.tokens)
	}
	c.put(tokenCacheKey("m", []byte("huge")), make([]uint32, 11+entryOverhead)) // larger than the whole cache: not kept
	if c.get(tokenCacheKey("m", []byte("huge"))) != nil || c.tokens != 7+2*entryOverhead {
		t.Fatal("an answer larger than the cache was kept")
	}
	// Many tiny answers are bounded by their entries, not only their
	// tokens: a client sending distinct one-token prompts cannot make the
	// cache hold millions of entries.
	tiny := newTokenCache(4 << 20)
	for i := range 200_000 {
		tiny.put(tokenCacheKey("m", []byte(strconv.Itoa(i))), []uint32{uint32(i)})
	}
	if n, most := len(tiny.byKey), (4<<20)/(1+entryOverhead); n > most {
		t.Fatalf("%d one-token answers held, more than %d", n, most)
	}
	var off *tokenCache = newTokenCache(0)
	off.put(tokenCacheKey("m", nil), []uint32{1})
	if off.get(tokenCacheKey("m", nil)) != nil {
		t.Fatal("a cache of size 0 must be off")
	}
}

// TestFindUsageTriesAFew: a tail of unclosed usage objects is tried at its
// last few, not at each: a worker's answer ending in some 900 of them cost
// 28 ms and 21 MB of the gateway's a request. The last whole one still
// decodes past a cut-off key and a null.
func TestFindUsageTriesAFew(t *testing.T) {
	tail := []byte(strings.Repeat(`{"usage":{"prompt_tokens":1,`, usageTailSize/28))
	allocs := testing.AllocsPerRun(10, func() {
		if _, ok := findUsage(tail); ok {
			t.Fatal("a usage found in a tail of unclosed objects")
		}
	})
	// A decoder is some 5 allocations: 4 tries are some 20; each of the
	// 292 objects made some 1,460.
	if allocs > 100 {
		t.Errorf("%.0f allocations for a tail of unclosed objects, want a few tries' worth", allocs)
	}
	good := []byte(`data: {"usage":{"prompt_tokens":7}}` + "\n\n" + `data: {"usage":null,"x":"sage\":"}` + "\n\n")
	if u, ok := findUsage(good); !ok || u.PromptTokens != 7 {
		t.Errorf("the last whole usage: %+v %v", u, ok)
	}
}

// BenchmarkFindUsage finds the usage in an honest stream's tail and in a
// tail of unclosed usage objects (a hostile worker's).
func BenchmarkFindUsage(b *testing.B) {
	honest := []byte(strings.Repeat(`data: {"choices":[{"delta":{"content":"x"}}],"usage":null}`+"\n\n", 100) +
		`data: {"choices":[],"usage":{"prompt_tokens":7,"total_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}` + "\n\ndata: [DONE]\n\n")
	honest = honest[max(0, len(honest)-usageTailSize):]
	hostile := []byte(strings.Repeat(`{"usage":{"prompt_tokens":1,`, usageTailSize/28))
	for name, tail := range map[string][]byte{"honest": honest, "hostile": hostile} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				findUsage(tail)
			}
		})
	}
}
