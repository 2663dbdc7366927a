package fidelity

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// model is kvmock's served model.
const model = "default"

// words returns n words of text unique to seed.
func words(seed string, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("%s%d", seed, i)
	}
	return strings.Join(w, " ")
}

// weatherTool is a tool definition as OpenAI clients send it.
var weatherTool = []any{map[string]any{
	"type": "function",
	"function": map[string]any{
		"name":        "get_weather",
		"description": "Get the weather of a city",
		"parameters": map[string]any{
			"type":       "object",
			"properties": map[string]any{"city": map[string]any{"type": "string"}},
			"required":   []string{"city"},
		},
	},
}}

// session is one multi-turn chat.
type session struct {
	id       string
	tools    []any
	messages []map[string]any
}

// turn sends the session's next user message (with a tool call and its
// result before it every third turn) and appends the assistant's answer.
func (s *session) turn(t *testing.T, g *gateway, n int) answer {
	t.Helper()
	if n > 0 && n%3 == 0 && s.tools != nil {
		call := fmt.Sprintf("call_%s_%d", s.id, n)
		s.messages = append(s.messages,
			map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{
				"id": call, "type": "function",
				"function": map[string]any{"name": "get_weather", "arguments": `{"city":"Paris"}`},
			}}},
			map[string]any{"role": "tool", "tool_call_id": call, "content": words("sunny"+s.id, 20)})
	}
	s.messages = append(s.messages, map[string]any{"role": "user", "content": words(fmt.Sprintf("q%s_%d_", s.id, n), 40)})
	body := map[string]any{"model": model, "messages": s.messages, "max_tokens": 8}
	if s.tools != nil {
		body["tools"] = s.tools
	}
	a := g.post(t, "/v1/chat/completions", body, "X-Session-ID", s.id)
	if a.status != 200 {
		t.Fatalf("session %s turn %d: %d %s", s.id, n, a.status, a.body)
	}
	var v struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(a.body, &v); err != nil || len(v.Choices) == 0 {
		t.Fatalf("session %s turn %d: answer %s (%v)", s.id, n, a.body, err)
	}
	s.messages = append(s.messages, map[string]any{"role": "assistant", "content": v.Choices[0].Message.Content})
	return a
}

// predicted is the gateway's predicted cache hit for an answer, capped as
// the engine reports it (the last prompt token is always computed).
func predicted(t *testing.T, a answer) int {
	t.Helper()
	p, err := strconv.Atoi(a.header.Get("X-KVRouter-Cached-Tokens"))
	if err != nil {
		t.Fatalf("no X-KVRouter-Cached-Tokens: %v", a.header)
	}
	limit := (a.usage.PromptTokens - 1) / blockSize * blockSize
	return min(p, limit)
}

// Chat with and without tools, multi-turn, through a faithful vLLM: the
// gateway's tokens are the engine's (no prompt-token mismatch), its
// predicted cache hits are the engine's reported ones, and a session's
// later turns find their earlier turns cached.
func TestChatPredictionsMatchTheEngine(t *testing.T) {
	g := startGateway(t)
	startFleet(t, g, 2, true)
	shared := words("system", 100)
	var sessions []*session
	for i := range 6 {
		s := &session{id: fmt.Sprintf("s%d", i), messages: []map[string]any{{"role": "system", "content": shared}}}
		if i%2 == 0 {
			s.tools = weatherTool
		}
		sessions = append(sessions, s)
	}
	const turns = 7
	requests := 0
	for n := range turns {
		for _, s := range sessions {
			a := s.turn(t, g, n)
			requests++
			if !a.reported {
				t.Fatalf("session %s turn %d: no usage: %s", s.id, n, a.body)
			}
			if want := predicted(t, a); a.usage.cached() != want {
				t.Errorf("session %s turn %d (tools %v): the engine reported %d cached tokens of %d, the gateway predicted %d",
					s.id, n, s.tools != nil, a.usage.cached(), a.usage.PromptTokens, want)
			}
			if n > 0 && a.usage.cached() == 0 {
				t.Errorf("session %s turn %d: nothing of the earlier turns was cached", s.id, n)
			}
		}
	}
	// First turns with nothing cached have no cached-token details; those
	// before the engines ever reported any cannot be told from an engine
	// that does not report them, and are left out.
	p := g.predictions(t, model)
	if p.Requests != uint64(requests) || p.PromptTokensMismatch != 0 || p.NoCachedTokens > uint64(len(sessions)) ||
		p.CachedExact+p.NoCachedTokens != uint64(requests) || p.NoUsage != 0 {
		t.Fatalf("the gateway's accounting: %+v after %d requests", p, requests)
	}
	if !strings.Contains(g.metrics(t), `kvrouter_prediction_accuracy_ratio{model="default"} 1`) {
		t.Error("kvrouter_prediction_accuracy_ratio is not 1")
	}
}

// Completions with a text prompt are tokenized with the BOS the engine
// adds to them, so their predictions hold too.
func TestTextPromptPredictionsMatchTheEngine(t *testing.T) {
	g := startGateway(t)
	startFleet(t, g, 2, true)
	prefix := words("doc", 200)
	for i := range 6 {
		a := g.post(t, "/v1/completions", map[string]any{"model": model, "prompt": prefix + " " + words(fmt.Sprintf("tail%d_", i), 30), "max_tokens": 4})
		if a.status != 200 || !a.reported {
			t.Fatalf("completion %d: %d %s", i, a.status, a.body)
		}
		if want := predicted(t, a); a.usage.cached() != want {
			t.Errorf("completion %d: the engine reported %d cached tokens, the gateway predicted %d", i, a.usage.cached(), want)
		}
		if i > 0 && a.usage.cached() < 192 {
			t.Errorf("completion %d: the shared 200-word prefix was not found cached (%d tokens)", i, a.usage.cached())
		}
	}
	if p := g.predictions(t, model); p.PromptTokensMismatch != 0 || p.NoCachedTokens != 1 || p.CachedExact != 5 {
		t.Fatalf("the gateway's accounting: %+v", p)
	}
}

// A stream that did not ask for usage gets the stream it asked for (no
// usage chunk), while the gateway still reads the engine's usage; one
// that asked gets its usage.
func TestStreamUsageIsReadNotShown(t *testing.T) {
	g := startGateway(t)
	f := startFleet(t, g, 1, true)
	msgs := []map[string]any{{"role": "user", "content": words("stream", 50)}}
	// The first answer caches the prompt; the engine's reports of cached
	// tokens start with the second. Each request waits for the events of
	// the answers before it (settle), so that what it compares is the
	// prediction, not the events' flight time on a loaded machine.
	for range 2 {
		if a := g.post(t, "/v1/chat/completions", map[string]any{"model": model, "messages": msgs, "max_tokens": 5}); !a.reported {
			t.Fatalf("no usage: %s", a.body)
		}
		g.settle(t, f)
	}
	a := g.post(t, "/v1/chat/completions", map[string]any{"model": model, "messages": msgs, "max_tokens": 5, "stream": true})
	if a.status != 200 || !strings.HasSuffix(strings.TrimSpace(string(a.body)), "data: [DONE]") {
		t.Fatalf("stream: %d %s", a.status, a.body)
	}
	if a.reported {
		t.Fatalf("the client got a usage chunk it did not ask for:\n%s", a.body)
	}
	if p := g.predictions(t, model); p.Requests != 3 || p.NoUsage != 0 || p.CachedExact != 2 || p.ReportedCachedTokens == 0 {
		t.Fatalf("the gateway did not read the stream's usage: %+v", p)
	}
	g.settle(t, f)
	a = g.post(t, "/v1/chat/completions", map[string]any{"model": model, "messages": msgs, "max_tokens": 5, "stream": true,
		"stream_options": map[string]any{"include_usage": true}})
	if !a.reported || a.usage.cached() != predicted(t, a) {
		t.Fatalf("a stream that asked for usage: %s", a.body)
	}
}

// A worker whose /tokenize disagrees with what it prefills (kvmock's
// deliberate skews) is noticed: the mismatch counter moves and the
// gateway's warning names the likely cause.
func TestDisagreementIsNoticed(t *testing.T) {
	for _, c := range []struct{ skew, cause string }{{"bos", "special_tokens"}, {"template", "chat_template"}} {
		t.Run(c.skew, func(t *testing.T) {
			g := startGateway(t)
			startFleet(t, g, 2, true, "--tokenize-skew", c.skew)
			s := &session{id: "skew", tools: weatherTool, messages: []map[string]any{{"role": "system", "content": words("sys", 30)}}}
			for n := range 3 {
				s.turn(t, g, n)
			}
			if p := g.predictions(t, model); p.PromptTokensMismatch != 3 {
				t.Fatalf("%d of 3 mismatches counted: %+v", p.PromptTokensMismatch, p)
			}
			if !strings.Contains(g.metrics(t), `kvrouter_prompt_tokens_mismatch_total{model="default"} 3`) {
				t.Error("kvrouter_prompt_tokens_mismatch_total is not 3")
			}
			log := g.Log()
			if n := strings.Count(log, `"likely_cause":"`+c.cause+`"`); n != 1 {
				t.Fatalf("%d warnings naming %s (want one a minute):\n%s", n, c.cause, g.LogTail(20))
			}
		})
	}
}

// Retrieved documents: vLLM's chat route renders them, its /tokenize has
// no such field; sent inside chat_template_kwargs they render the same.
func TestDocumentsPredictionsMatchTheEngine(t *testing.T) {
	g := startGateway(t)
	f := startFleet(t, g, 2, true)
	body := map[string]any{"model": model, "max_tokens": 4,
		"messages":  []map[string]any{{"role": "user", "content": words("ask", 30)}},
		"documents": []map[string]string{{"title": "Manual", "text": words("manual", 120)}}}
	for i := range 3 {
		g.settle(t, f)
		a := g.post(t, "/v1/chat/completions", body)
		if a.status != 200 || a.usage.cached() != predicted(t, a) {
			t.Fatalf("request %d: %d, reported %d cached, predicted %d: %s", i, a.status, a.usage.cached(), predicted(t, a), a.body)
		}
		if i > 0 && a.usage.cached() == 0 {
			t.Fatalf("request %d: the same prompt again found nothing cached (worker %s; the gateway's index holds %d blocks)",
				i, a.header.Get("X-KVRouter-Worker"), g.indexedBlocks(t))
		}
	}
	if p := g.predictions(t, model); p.PromptTokensMismatch != 0 {
		t.Fatalf("the gateway tokenized another prompt than the engine prefilled: %+v", p)
	}
}

// The same request again is not tokenized again: the gateway remembers
// the /tokenize answer by its body.
func TestIdenticalRequestsAreTokenizedOnce(t *testing.T) {
	g := startGateway(t)
	startFleet(t, g, 2, true)
	body := map[string]any{"model": model, "max_tokens": 4, "tools": weatherTool,
		"messages": []map[string]any{{"role": "user", "content": words("same", 300)}}}
	for range 4 {
		if a := g.post(t, "/v1/chat/completions", body); a.status != 200 {
			t.Fatalf("%d %s", a.status, a.body)
		}
	}
	res, err := client.Get(g.admin + "/kv_router/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var stats struct {
		TokenizeCache struct{ Hits, Misses int } `json:"tokenize_cache"`
	}
	if err := json.NewDecoder(res.Body).Decode(&stats); err != nil {
		t.Fatal(err)
	}
	if stats.TokenizeCache.Hits != 3 || stats.TokenizeCache.Misses != 1 {
		t.Fatalf("tokenize cache: %+v, want 3 hits and 1 miss", stats.TokenizeCache)
	}
	if p := g.predictions(t, model); p.PromptTokensMismatch != 0 || p.Requests != 4 {
		t.Fatalf("%+v", p)
	}
}
