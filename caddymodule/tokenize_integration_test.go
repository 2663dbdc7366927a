package caddymodule

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// TestTokenizationMatchesWhatVLLMPrefills: the gateway's tokens for a chat
// or text request must be the ones the engine will prefill, or every
// cached block is missed without an error anywhere. The workers tokenize
// as vLLM does with a template that writes its own BOS (vllmtokens_test.go);
// each holds the blocks vLLM would have stored for one request, and the
// request must find all of them. One worker's HTTP server is down: its
// /tokenize fails and another worker's answers, within the timeout.
func TestTokenizationMatchesWhatVLLMPrefills(t *testing.T) {
	tester := newTester(t)
	w1, w2, dead := newTestWorker(t, 1), newTestWorker(t, 2), newTestWorker(t, 3)
	w1.chatTemplate, w2.chatTemplate, dead.chatTemplate = true, true, true
	_ = dead.srv.Close()
	tester.InitServer(proxyCaddyfile(workerBlock(w1)+workerBlock(w2)+workerBlock(dead)), "caddyfile")
	for _, w := range []*testWorker{w1, w2, dead} {
		w.waitSubscribed()
	}

	chatBody := `{"model":"m","messages":[{"role":"system","content":"you are a helpful agent with tools."},` +
		`{"role":"user","content":"list the files of the repository, then read the readme."}],` +
		`"tools":[{"type":"function","function":{"name":"list_files","parameters":{}}},` +
		`{"type":"function","function":{"name":"read_file","parameters":{}}}]}`
	var chat vllmChatRequest
	if err := json.Unmarshal([]byte(chatBody), &chat); err != nil {
		t.Fatal(err)
	}
	// What vLLM prefills for it: the chat defaults (add_generation_prompt
	// true, add_special_tokens false).
	chatTokens := vllmChatTokens(&chat)
	w2.announce(chatTokens, 4)
	waitIndexed(t, 2, len(chatTokens)/4)

	text := strings.Repeat("once upon a time, in a cache far away. ", 3)
	prompt := vllmChatRequest{Prompt: text}
	promptTokens := vllmPromptTokens(&prompt) // the completions default: add_special_tokens true
	w1.announce(promptTokens, 4)
	waitIndexed(t, 1, len(promptTokens)/4)

	failures := testCounter(tokenizeFailures)
	for _, tc := range []struct {
		name, path, body string
		worker           string
		cached           int
	}{
		{"chat with tools", "/v1/chat/completions", chatBody, "2", len(chatTokens) / 4 * 4},
		{"text prompt", "/v1/completions", `{"model":"m","prompt":"` + text + `"}`, "1", len(promptTokens) / 4 * 4},
	} {
		// Three times, so that the dead worker's /tokenize comes first
		// once in the tokenizer's rotation.
		for i := range 3 {
			res, body := post(t, tester, tc.path, tc.body)
			if res.StatusCode != 200 || res.Header.Get("X-KVRouter-Worker") != tc.worker ||
				res.Header.Get("X-KVRouter-Cached-Tokens") != strconv.Itoa(tc.cached) {
				t.Fatalf("%s, try %d: status %d, worker %q, cached %q, want worker %s with %d cached: %s", tc.name, i,
					res.StatusCode, res.Header.Get("X-KVRouter-Worker"), res.Header.Get("X-KVRouter-Cached-Tokens"), tc.worker, tc.cached, body)
			}
		}
	}
	if n := testCounter(tokenizeFailures) - failures; n != 0 {
		t.Errorf("%v requests lost their tokens", n)
	}
	waitNoReservations(t)
}

// TestTokenizeBodies: what the gateway asks /tokenize, field by field.
func TestTokenizeBodies(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  openAIRequest
		chat bool
		want string
	}{
		{"chat defaults", openAIRequest{Model: "m", Messages: []byte(`[{"role":"user","content":"hi"}]`)}, true,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":true,"add_special_tokens":false}`},
		{"chat, the client's template fields", openAIRequest{Model: "m", Messages: []byte(`[]`), templateFields: templateFields{
			Tools: []byte(`[{"type":"function"}]`), ChatTemplate: []byte(`"{{x}}"`), ChatTemplateKwargs: []byte(`{"enable_thinking":false}`),
			AddGenerationPrompt: []byte(`false`), ContinueFinalMessage: []byte(`true`), Documents: []byte(`[{"text":"d"}]`),
			AddSpecialTokens: []byte(`true`), ToolChoice: []byte(`"auto"`), ReasoningEffort: []byte(`"low"`)}}, true,
			`{"model":"m","messages":[],"tools":[{"type":"function"}],"chat_template":"{{x}}",` +
				`"chat_template_kwargs":{"documents":[{"text":"d"}],"reasoning_effort":"low","enable_thinking":true,"enable_thinking":false},` +
				`"continue_final_message":true,"tool_choice":"auto","reasoning_effort":"low","add_generation_prompt":false,"add_special_tokens":true}`},
		{"chat, documents without kwargs", openAIRequest{Model: "m", Messages: []byte(`[]`), templateFields: templateFields{
			Documents: []byte(`[{"text":"d"}]`)}}, true,
			`{"model":"m","messages":[],"chat_template_kwargs":{"documents":[{"text":"d"}]},"add_generation_prompt":true,"add_special_tokens":false}`},
		{"chat, the client's kwargs name documents themselves", openAIRequest{Model: "m", Messages: []byte(`[]`), templateFields: templateFields{
			Documents: []byte(`[1]`), ChatTemplateKwargs: []byte(`{"documents":[2]}`)}}, true,
			`{"model":"m","messages":[],"chat_template_kwargs":{"documents":[1],"documents":[2]},"add_generation_prompt":true,"add_special_tokens":false}`},
		{"chat, reasoning_effort as vLLM's chat route hands it to the template", openAIRequest{Model: "m", Messages: []byte(`[]`), templateFields: templateFields{
			ReasoningEffort: []byte(`"none"`)}}, true,
			`{"model":"m","messages":[],"chat_template_kwargs":{"reasoning_effort":"none","enable_thinking":false},"reasoning_effort":"none","add_generation_prompt":true,"add_special_tokens":false}`},
		{"chat, reasoning_effort none with an escape, read as the engine decodes it", openAIRequest{Model: "m", Messages: []byte(`[]`), templateFields: templateFields{
			ReasoningEffort: []byte(`"\u006eone"`)}}, true,
			`{"model":"m","messages":[],"chat_template_kwargs":{"reasoning_effort":"\u006eone","enable_thinking":false},"reasoning_effort":"\u006eone","add_generation_prompt":true,"add_special_tokens":false}`},
		{"chat, a null reasoning_effort", openAIRequest{Model: "m", Messages: []byte(`[]`), templateFields: templateFields{
			ReasoningEffort: []byte(`null`), ChatTemplateKwargs: []byte(`{"x":1}`)}}, true,
			`{"model":"m","messages":[],"chat_template_kwargs":{"x":1},"add_generation_prompt":true,"add_special_tokens":false}`},
		{"chat, null fields take the defaults", openAIRequest{Model: "m", Messages: []byte(`[]`), templateFields: templateFields{
			Tools: []byte(`null`), AddSpecialTokens: []byte(` null `)}}, true,
			`{"model":"m","messages":[],"add_generation_prompt":true,"add_special_tokens":false}`},
		{"text prompt default", openAIRequest{Model: "m", RawPrompt: []byte(`"hello"`)}, false,
			`{"model":"m","prompt":"hello","add_special_tokens":true}`},
		{"text prompt without special tokens", openAIRequest{Model: "m\"x", RawPrompt: []byte(`"hello"`),
			templateFields: templateFields{AddSpecialTokens: []byte(`false`)}}, false,
			`{"model":"m\"x","prompt":"hello","add_special_tokens":false}`},
	} {
		got := completionTokenizeBody(&tc.req)
		if tc.chat {
			got = chatTokenizeBody(&tc.req)
		}
		if string(got) != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
		if !json.Valid(got) {
			t.Errorf("%s: not JSON: %s", tc.name, got)
		}
	}
}
