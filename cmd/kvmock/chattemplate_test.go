package main

import (
	"slices"
	"strings"
	"testing"

	json "github.com/goccy/go-json"
)

// weatherTool is a tool definition as a client sends it.
var weatherTool = json.RawMessage(`{"type":"function","function":{"name":"get_weather","description":"Weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}`)

func TestTemplateShape(t *testing.T) {
	in := &chatInput{
		Messages:            []chatMessage{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}},
		AddGenerationPrompt: true,
	}
	want := "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" +
		"Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>" +
		"<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" +
		"<|start_header_id|>assistant<|end_header_id|>\n\n"
	if got := renderChat(in); got != want {
		t.Fatalf("render\n%q\nwant\n%q", got, want)
	}
	// Without a generation prompt the text ends with the last message.
	in.AddGenerationPrompt = false
	if got := renderChat(in); !strings.HasSuffix(got, "Hi<|eot_id|>") {
		t.Fatalf("without generation prompt: %q", got)
	}
	// continue_final_message leaves the last message open.
	in.Messages = append(in.Messages, chatMessage{Role: "assistant", Content: "Sure,"})
	in.ContinueFinalMessage = true
	if got := renderChat(in); !strings.HasSuffix(got, "<|start_header_id|>assistant<|end_header_id|>\n\nSure,") {
		t.Fatalf("continued: %q", got)
	}
}

func TestToolsChangeEveryBlock(t *testing.T) {
	msgs := []chatMessage{{Role: "system", Content: words("s", 40)}, {Role: "user", Content: words("u", 40)}}
	plain := tokenize(nil, renderChat(&chatInput{Messages: msgs, AddGenerationPrompt: true}))
	withTools := tokenize(nil, renderChat(&chatInput{Messages: msgs, Tools: []json.RawMessage{weatherTool}, AddGenerationPrompt: true}))
	if plain[0] != tokBOS || withTools[0] != tokBOS {
		t.Fatal("the template did not write BOS first")
	}
	// The tools are in the system block at the start: the two prompts part
	// within the first block of 16 tokens.
	if n := commonPrefixLen(plain, withTools); n >= 16 {
		t.Fatalf("with and without tools share %d tokens", n)
	}
	text := renderChat(&chatInput{Messages: msgs, Tools: []json.RawMessage{weatherTool}})
	for _, want := range []string{"Environment: ipython", `"name": "get_weather"`, `"city": {`} {
		if !strings.Contains(text, want) {
			t.Fatalf("rendered tools lack %q:\n%s", want, text)
		}
	}
}

func TestTemplateInputsChangeTheRender(t *testing.T) {
	msgs := []chatMessage{{Role: "user", Content: "hello"}}
	base := renderChat(&chatInput{Messages: msgs, AddGenerationPrompt: true})
	for name, in := range map[string]*chatInput{
		"chat_template":        {Messages: msgs, AddGenerationPrompt: true, Template: "{{ messages }}"},
		"other chat_template":  {Messages: msgs, AddGenerationPrompt: true, Template: "{{ messages }} "},
		"date_string":          {Messages: msgs, AddGenerationPrompt: true, Kwargs: map[string]json.RawMessage{"date_string": json.RawMessage(`"1 Jan 2026"`)}},
		"documents":            {Messages: msgs, AddGenerationPrompt: true, Documents: []map[string]string{{"title": "T", "text": "body"}}},
		"no generation prompt": {Messages: msgs},
	} {
		got := renderChat(in)
		if got == base {
			t.Errorf("%s: same render as without it", name)
		}
		if again := renderChat(in); again != got {
			t.Errorf("%s: render is not deterministic", name)
		}
	}
	// A kwarg the template does not read changes nothing, as in Jinja.
	in := &chatInput{Messages: msgs, AddGenerationPrompt: true, Kwargs: map[string]json.RawMessage{"unused": json.RawMessage(`1`)}}
	if renderChat(in) != base {
		t.Error("an unread kwarg changed the render")
	}
	if got := renderChat(&chatInput{Messages: msgs, Kwargs: map[string]json.RawMessage{"date_string": json.RawMessage(`"1 Jan 2026"`)}}); !strings.Contains(got, "Today Date: 1 Jan 2026\n") {
		t.Errorf("date_string not written: %q", got)
	}
}

// TestNextTurnExtendsThePrompt is the property prefix caching of a
// conversation rests on: turn N rendered with its generation prompt is a
// token prefix of turn N+1, with assistant answers, tool calls and tool
// results in between.
func TestNextTurnExtendsThePrompt(t *testing.T) {
	tools := []json.RawMessage{weatherTool}
	turns := [][]chatMessage{
		{{Role: "system", Content: "You are an agent."}, {Role: "user", Content: "What is the weather in Paris?"}},
		{{Role: "assistant", ToolCalls: []toolCall{{Name: "get_weather", Arguments: `{"city": "Paris"}`}}},
			{Role: "tool", Content: `{"temp": 21}`}},
		{{Role: "assistant", Content: "It is 21 degrees."}, {Role: "user", Content: "And tomorrow?"}},
	}
	var msgs []chatMessage
	var prev []uint32
	for i, add := range turns {
		msgs = append(msgs, add...)
		cur := tokenize(nil, renderChat(&chatInput{Messages: msgs, Tools: tools, AddGenerationPrompt: true}))
		if i > 0 && (len(cur) <= len(prev) || !slices.Equal(cur[:len(prev)], prev)) {
			t.Fatalf("turn %d does not extend turn %d", i, i-1)
		}
		prev = cur
	}
	text := renderChat(&chatInput{Messages: msgs, Tools: tools})
	for _, want := range []string{`<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>`,
		"<|start_header_id|>ipython<|end_header_id|>\n\n{\"temp\": 21}<|eot_id|>"} {
		if !strings.Contains(text, want) {
			t.Fatalf("render lacks %q:\n%s", want, text)
		}
	}
}

// commonPrefixLen is the length of the longest common prefix of a and b.
func commonPrefixLen(a, b []uint32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}
