package main

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	json "github.com/goccy/go-json"
)

// The chat template, shaped like Llama 3.1's (kvmock cannot run Jinja, so
// this is Go that writes what such a template writes):
//
//	<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n
//	[Chat template: <16 hex digits>\n]        a per-request chat_template
//	[Environment: ipython\n]                  with tools
//	[Reasoning effort: "<effort>"\n]          chat_template_kwargs.reasoning_effort
//	[Thinking: on\n]                          chat_template_kwargs.enable_thinking true
//	Cutting Knowledge Date: December 2023\n
//	Today Date: <date_string>\n\n             chat_template_kwargs.date_string, default 26 Jul 2024
//	[the tools, each as indented JSON]
//	[the documents, title and text]
//	<the first message's content if it is a system message><|eot_id|>
//	then each other message:
//	<|start_header_id|><role><|end_header_id|>\n\n<content>[<|python_tag|><tool call>...]<|eot_id|>
//	(a tool message's role is written ipython, as Llama's template does)
//	[<|start_header_id|>assistant<|end_header_id|>\n\n]   add_generation_prompt
//
// With continue_final_message the last message stays open: no <|eot_id|>
// after it, and no generation prompt. The template writes the BOS token
// itself, which is why vLLM's chat route tokenizes the rendered text with
// add_special_tokens false.
//
// Everything a request's tools, documents, template or kwargs change is
// in the system block at the start, so changing any of them changes every
// block of the prompt, as with real templates: a gateway that tokenizes
// without them misses every cached block.

// chatMessage is one message as the template reads it.
type chatMessage struct {
	Role    string
	Content string
	// ToolCalls are an assistant message's calls.
	ToolCalls []toolCall
}

// toolCall is one function call an assistant message made.
type toolCall struct {
	Name string
	// Arguments is the JSON text of the arguments, as the client sent it.
	Arguments string
}

// chatInput is everything of a chat request the template reads.
type chatInput struct {
	Messages []chatMessage
	// Tools are the tool definitions, each as its raw JSON.
	Tools []json.RawMessage
	// Documents are retrieved documents (vLLM's documents field).
	Documents []map[string]string
	// Template is the request's chat_template; "" means the model's own.
	Template string
	// Kwargs are chat_template_kwargs; the template reads date_string,
	// reasoning_effort and enable_thinking.
	Kwargs               map[string]json.RawMessage
	AddGenerationPrompt  bool
	ContinueFinalMessage bool
}

// defaultDate is the date Llama 3.1's template writes when not told one.
const defaultDate = "26 Jul 2024"

// renderChat writes the prompt text of a chat.
func renderChat(in *chatInput) string {
	var b strings.Builder
	b.WriteString("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")
	if in.Template != "" {
		fmt.Fprintf(&b, "Chat template: %016x\n", fnvString(in.Template))
	}
	if len(in.Tools) > 0 {
		b.WriteString("Environment: ipython\n")
	}
	if effort, ok := in.Kwargs["reasoning_effort"]; ok && string(effort) != "null" {
		fmt.Fprintf(&b, "Reasoning effort: %s\n", effort)
	}
	if thinking, ok := in.Kwargs["enable_thinking"]; ok && string(thinking) == "true" {
		b.WriteString("Thinking: on\n")
	}
	b.WriteString("Cutting Knowledge Date: December 2023\nToday Date: ")
	b.WriteString(in.date())
	b.WriteString("\n\n")
	if len(in.Tools) > 0 {
		b.WriteString("You may call these functions. To call one, answer with a JSON object " +
			`{"name": <function name>, "parameters": <arguments by name>}.` + "\n\n")
		for _, t := range in.Tools {
			var out bytes.Buffer
			if json.Indent(&out, t, "", "    ") != nil {
				out.Reset()
				out.Write(t)
			}
			b.Write(out.Bytes())
			b.WriteString("\n\n")
		}
	}
	for i, d := range in.Documents {
		writeDocument(&b, i+1, d)
	}
	msgs := in.Messages
	if len(msgs) > 0 && msgs[0].Role == "system" {
		b.WriteString(msgs[0].Content)
		msgs = msgs[1:]
		if len(msgs) == 0 && in.ContinueFinalMessage {
			return b.String()
		}
	}
	b.WriteString("<|eot_id|>")
	for i, m := range msgs {
		role := m.Role
		if role == "tool" {
			role = "ipython"
		}
		b.WriteString("<|start_header_id|>")
		b.WriteString(role)
		b.WriteString("<|end_header_id|>\n\n")
		b.WriteString(m.Content)
		for _, c := range m.ToolCalls {
			fmt.Fprintf(&b, `<|python_tag|>{"name": %q, "parameters": %s}`, c.Name, c.Arguments)
		}
		if i == len(msgs)-1 && in.ContinueFinalMessage {
			return b.String()
		}
		b.WriteString("<|eot_id|>")
	}
	if in.AddGenerationPrompt {
		b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
	}
	return b.String()
}

// date is the date the template writes: chat_template_kwargs.date_string
// as text (a JSON string unquoted, anything else as written), or the
// default.
func (in *chatInput) date() string {
	raw, ok := in.Kwargs["date_string"]
	if !ok || len(raw) == 0 || string(raw) == "null" {
		return defaultDate
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

// writeDocument writes one document: its title and text, then any other
// fields in key order.
func writeDocument(b *strings.Builder, n int, d map[string]string) {
	fmt.Fprintf(b, "Document %d: %s\n%s\n", n, d["title"], d["text"])
	keys := make([]string, 0, len(d))
	for k := range d {
		if k != "title" && k != "text" {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(b, "%s: %s\n", k, d[k])
	}
	b.WriteString("\n")
}
