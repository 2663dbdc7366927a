package main

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// Tests of what each route tokenizes, with vLLM's defaults, and of
// /tokenize answering exactly what the completion routes prefill.

// tokenizeAnswer is vLLM's /tokenize answer.
type tokenizeAnswer struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

// tokenizeVia asks worker id's /tokenize and fails the test unless 200.
func tokenizeVia(t *testing.T, f *Fleet, id int, body map[string]any) tokenizeAnswer {
	t.Helper()
	res, b := postJSON(t, f.url(id)+"/tokenize", body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("/tokenize: %d %s", res.StatusCode, b)
	}
	var a tokenizeAnswer
	if err := json.Unmarshal(b, &a); err != nil || a.Count != len(a.Tokens) {
		t.Fatalf("/tokenize answer %s (%v)", b, err)
	}
	return a
}

// completeVia posts a completion body to path on worker id and returns
// the answer, failing the test unless 200.
func completeVia(t *testing.T, f *Fleet, id int, path string, body map[string]any) completion {
	t.Helper()
	res, b := postJSON(t, f.url(id)+path, body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %s", path, res.StatusCode, b)
	}
	var c completion
	if err := json.Unmarshal(b, &c); err != nil || c.Usage == nil {
		t.Fatalf("%s: answer %s (%v)", path, b, err)
	}
	return c
}

// with returns a copy of body with more fields.
func with(body map[string]any, kv ...any) map[string]any {
	out := make(map[string]any, len(body)+len(kv)/2)
	for k, v := range body {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

// agentChat is a chat body with a system prompt, tools, a tool call and
// its result, long enough for several blocks.
func agentChat() map[string]any {
	return map[string]any{
		"model": "default",
		"messages": []map[string]any{
			{"role": "system", "content": words("sys", 40)},
			{"role": "user", "content": []map[string]any{{"type": "text", "text": words("task", 30)}, {"type": "text", "text": "please"}}},
			{"role": "assistant", "content": nil, "tool_calls": []map[string]any{
				{"id": "call_1", "type": "function", "function": map[string]any{"name": "get_weather", "arguments": `{"city": "Paris"}`}}}},
			{"role": "tool", "tool_call_id": "call_1", "content": words("result", 20)},
		},
		"tools": []json.RawMessage{json.RawMessage(weatherTool)},
	}
}

// TestTokenizeEqualsWhatChatPrefills compares /tokenize's chat answer
// with the prompt the chat route prefilled: its usage.prompt_tokens, and
// the cached tokens of a repeat, which hits every whole block but the one
// holding the last token.
func TestTokenizeEqualsWhatChatPrefills(t *testing.T) {
	f := newTestFleet(t, nil)
	chat := agentChat()
	tok := tokenizeVia(t, f, 1, chat)
	if tok.Tokens[0] != tokBOS || tok.Tokens[1] == tokBOS {
		t.Fatalf("chat tokens start %v: want the template's one BOS", tok.Tokens[:2])
	}
	first := completeVia(t, f, 1, "/v1/chat/completions", with(chat, "max_tokens", 1))
	if first.Usage.PromptTokens != tok.Count {
		t.Fatalf("chat prefilled %d tokens, /tokenize says %d", first.Usage.PromptTokens, tok.Count)
	}
	again := completeVia(t, f, 1, "/v1/chat/completions", with(chat, "max_tokens", 1))
	if want := (tok.Count - 1) / 16 * 16; again.Usage.PromptTokensDetails.CachedTokens != want {
		t.Fatalf("repeat cached %d, want %d", again.Usage.PromptTokensDetails.CachedTokens, want)
	}
	// The same tokens sent as ids are the same prompt: the same hit.
	ids := completeVia(t, f, 1, "/v1/completions", map[string]any{"prompt": tok.Tokens, "max_tokens": 1})
	if ids.Usage.PromptTokens != tok.Count || ids.Usage.PromptTokensDetails.CachedTokens != again.Usage.PromptTokensDetails.CachedTokens {
		t.Fatalf("token ids: usage %+v", *ids.Usage)
	}
	// Another worker tokenizes the same.
	if other := tokenizeVia(t, f, 2, chat); !slices.Equal(other.Tokens, tok.Tokens) {
		t.Fatal("workers tokenize the same chat differently")
	}
}

func TestAddSpecialTokensDefaultsPerRoute(t *testing.T) {
	f := newTestFleet(t, nil)
	chat := agentChat()
	plain := tokenizeVia(t, f, 1, chat)
	// A chat client that sends add_special_tokens true gets a second BOS,
	// on /tokenize and on the chat route alike, as in vLLM.
	doubled := tokenizeVia(t, f, 1, with(chat, "add_special_tokens", true))
	if doubled.Count != plain.Count+1 || doubled.Tokens[0] != tokBOS || doubled.Tokens[1] != tokBOS {
		t.Fatalf("add_special_tokens true: %d tokens starting %v", doubled.Count, doubled.Tokens[:2])
	}
	c := completeVia(t, f, 1, "/v1/chat/completions", with(chat, "add_special_tokens", true, "max_tokens", 1))
	if c.Usage.PromptTokens != doubled.Count {
		t.Fatalf("chat with add_special_tokens prefilled %d, want %d", c.Usage.PromptTokens, doubled.Count)
	}
	// A doubled BOS shifts every token: nothing the plain prompt cached hits.
	completeVia(t, f, 2, "/v1/chat/completions", with(chat, "max_tokens", 1))
	if c := completeVia(t, f, 2, "/v1/chat/completions", with(chat, "add_special_tokens", true, "max_tokens", 1)); c.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("a doubled BOS hit %d cached tokens", c.Usage.PromptTokensDetails.CachedTokens)
	}

	// A text prompt gets BOS by default, on /tokenize and on completions.
	text := words("p", 20)
	tok := tokenizeVia(t, f, 1, map[string]any{"prompt": text})
	if tok.Count != 21 || tok.Tokens[0] != tokBOS {
		t.Fatalf("text prompt: %v", tok.Tokens)
	}
	if c := completeVia(t, f, 1, "/v1/completions", map[string]any{"prompt": text, "max_tokens": 1}); c.Usage.PromptTokens != 21 {
		t.Fatalf("text completion prefilled %d", c.Usage.PromptTokens)
	}
	noBOS := tokenizeVia(t, f, 1, map[string]any{"prompt": text, "add_special_tokens": false})
	if !slices.Equal(noBOS.Tokens, tok.Tokens[1:]) {
		t.Fatal("add_special_tokens false did not drop exactly the BOS")
	}
	if c := completeVia(t, f, 1, "/v1/completions", map[string]any{"prompt": text, "add_special_tokens": false, "max_tokens": 1}); c.Usage.PromptTokens != 20 {
		t.Fatalf("add_special_tokens false prefilled %d", c.Usage.PromptTokens)
	}
	// Token ids are taken as given, add_special_tokens or not.
	if c := completeVia(t, f, 1, "/v1/completions", map[string]any{"prompt": []int{5, 6, 7}, "add_special_tokens": true, "max_tokens": 1}); c.Usage.PromptTokens != 3 {
		t.Fatalf("token ids prefilled %d", c.Usage.PromptTokens)
	}
	// Special tokens written in a text prompt are special tokens.
	if tok := tokenizeVia(t, f, 1, map[string]any{"prompt": "a<|eot_id|>b", "add_special_tokens": false}); !slices.Equal(tok.Tokens, []uint32{wordToken("a"), tokEOT, wordToken("b")}) {
		t.Fatalf("special token in text: %v", tok.Tokens)
	}
}

func TestTokenizeFields(t *testing.T) {
	f := newTestFleet(t, nil)
	msgs := []map[string]any{{"role": "user", "content": "hello there"}}
	base := tokenizeVia(t, f, 1, map[string]any{"messages": msgs})
	// add_generation_prompt defaults to true: false drops the 3 tokens of
	// the assistant header.
	if noGen := tokenizeVia(t, f, 1, map[string]any{"messages": msgs, "add_generation_prompt": false}); noGen.Count != base.Count-3 {
		t.Fatalf("add_generation_prompt false: %d tokens, want %d", noGen.Count, base.Count-3)
	}
	// continue_final_message leaves the last message open: no end of turn.
	cont := tokenizeVia(t, f, 1, map[string]any{"messages": msgs, "add_generation_prompt": false, "continue_final_message": true})
	if cont.Count != base.Count-4 || cont.Tokens[cont.Count-1] != wordToken("there") {
		t.Fatalf("continue_final_message: %v", cont.Tokens)
	}
	for name, body := range map[string]map[string]any{
		"tools":                {"messages": msgs, "tools": []json.RawMessage{weatherTool}},
		"chat_template":        {"messages": msgs, "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"},
		"chat_template_kwargs": {"messages": msgs, "chat_template_kwargs": map[string]any{"date_string": "2 Feb 2026"}},
		// vLLM's /tokenize has no documents field; the template reads
		// chat_template_kwargs, which the chat route merges over them.
		"documents in kwargs": {"messages": msgs, "chat_template_kwargs": map[string]any{"documents": []map[string]string{{"title": "Doc", "text": "some text"}}}},
	} {
		got := tokenizeVia(t, f, 1, body)
		if slices.Equal(got.Tokens, base.Tokens) {
			t.Errorf("%s changed nothing", name)
		}
		c := completeVia(t, f, 1, "/v1/chat/completions", with(body, "max_tokens", 1))
		if c.Usage.PromptTokens != got.Count {
			t.Errorf("%s: chat prefilled %d, /tokenize says %d", name, c.Usage.PromptTokens, got.Count)
		}
	}
	// documents as a field: the chat route renders them, /tokenize ignores
	// them, as vLLM's does.
	docs := map[string]any{"messages": msgs, "documents": []map[string]string{{"title": "Doc", "text": "some text"}}}
	if got := tokenizeVia(t, f, 1, docs); !slices.Equal(got.Tokens, base.Tokens) {
		t.Error("/tokenize rendered a documents field vLLM's would ignore")
	}
	inKwargs := tokenizeVia(t, f, 1, map[string]any{"messages": msgs, "chat_template_kwargs": map[string]any{"documents": docs["documents"]}})
	if c := completeVia(t, f, 1, "/v1/chat/completions", with(docs, "max_tokens", 1)); c.Usage.PromptTokens != inKwargs.Count {
		t.Errorf("documents: chat prefilled %d, /tokenize with them in chat_template_kwargs says %d", c.Usage.PromptTokens, inKwargs.Count)
	}
	// return_token_strs gives each token's text.
	strs := tokenizeVia(t, f, 1, map[string]any{"prompt": "hi<|eot_id|>", "return_token_strs": true})
	if !slices.Equal(strs.TokenStrs, []string{"<|begin_of_text|>", "hi", "<|eot_id|>"}) {
		t.Fatalf("token_strs %q", strs.TokenStrs)
	}
}

func TestChatRequestsVLLMRefuses(t *testing.T) {
	f := newTestFleet(t, nil)
	msgs := []map[string]any{{"role": "user", "content": "hello"}}
	cases := []struct {
		path string
		body map[string]any
		want string
	}{
		{"/v1/chat/completions", map[string]any{"messages": msgs, "continue_final_message": true, "add_generation_prompt": true}, "Cannot set both"},
		{"/tokenize", map[string]any{"messages": msgs, "continue_final_message": true}, "Cannot set both"},
		{"/v1/chat/completions", map[string]any{"messages": msgs, "tools": []any{}}, "must not be an empty array"},
		{"/v1/chat/completions", map[string]any{"messages": msgs, "tools": []any{map[string]any{"type": "function"}}}, "tools[0]"},
		{"/v1/chat/completions", map[string]any{"messages": []any{}}, "messages"},
		{"/v1/chat/completions", map[string]any{"messages": []map[string]any{{"content": "x"}}}, "role"},
		{"/v1/chat/completions", map[string]any{"messages": msgs, "chat_template_kwargs": []int{1}}, "chat_template_kwargs"},
		{"/tokenize", map[string]any{"prompt": []int{1, 2}}, "prompt must be a string"},
		{"/tokenize", map[string]any{}, "prompt must be a string"},
	}
	for _, c := range cases {
		res, b := postJSON(t, f.url(1)+c.path, c.body)
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), c.want) {
			t.Errorf("%s %v: %d %s, want 400 with %q", c.path, c.body, res.StatusCode, b, c.want)
		}
	}
	// /tokenize takes an empty tools array as no tools.
	if a, b := tokenizeVia(t, f, 1, map[string]any{"messages": msgs, "tools": []any{}}), tokenizeVia(t, f, 1, map[string]any{"messages": msgs}); !slices.Equal(a.Tokens, b.Tokens) {
		t.Error("an empty tools array changed /tokenize's answer")
	}
}
