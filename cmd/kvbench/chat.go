package main

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
)

// Chat sessions: a share of the agentic trace's sessions (--chat-share)
// go to /v1/chat/completions as text messages with a tools array, the way
// a coding agent talks to a model, instead of token ids. The gateway must
// then tokenize them through a worker's /tokenize, chat template, tools
// and all, to route them by prefix; a tokenization that differs from the
// engine's shows as a lower hit ratio and in the gateway's prediction
// accuracy. Each message's text is its trace ids written as words, one
// word per id, so the trace's structure (shared system prompt, growing
// context, compaction) is the same as for token sessions. An assistant
// message is the answer the model actually gave in that turn (its text
// from the stream), as an agent would append it, and a tool result
// follows an assistant message that called the tool.

// agentTools are the tools every chat session offers, as a coding agent
// would: the same for all sessions, so they are part of the shared prefix.
var agentTools = json.RawMessage(`[
 {"type": "function", "function": {"name": "read_file", "description": "Read a file of the repository.",
  "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "Path from the repository root."}}, "required": ["path"]}}},
 {"type": "function", "function": {"name": "search_code", "description": "Search the repository for a regular expression.",
  "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}}, "required": ["pattern"]}}},
 {"type": "function", "function": {"name": "run_tests", "description": "Run the tests of a package and return their output.",
  "parameters": {"type": "object", "properties": {"package": {"type": "string"}}, "required": ["package"]}}},
 {"type": "function", "function": {"name": "edit_file", "description": "Replace a string in a file.",
  "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}}, "required": ["path", "old", "new"]}}}
]`)

// toolNames are agentTools' names, for the calls.
var toolNames = [...]string{"read_file", "search_code", "run_tests", "edit_file"}

// syllables spell the trace's ids as words.
var syllables = [...]string{"ka", "lo", "mi", "nu", "pe", "ri", "so", "ta", "ve", "zu", "ba", "de", "fi", "go", "hu", "ja"}

// appendWord appends the word of id: its base-16 digits as syllables, at
// least two, so distinct ids are distinct words.
func appendWord(b []byte, id uint32) []byte {
	b = append(b, syllables[id%16]...)
	id /= 16
	for {
		b = append(b, syllables[id%16]...)
		id /= 16
		if id == 0 {
			return b
		}
	}
}

// wordsOf writes ids as words separated by spaces.
func wordsOf(ids []uint32) string {
	b := make([]byte, 0, len(ids)*7)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ' ')
		}
		b = appendWord(b, id)
	}
	return string(b)
}

// chatMessage is one message of a chat request.
type chatMessage struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	ToolCalls  []toolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

// toolCall is a call an assistant message made, in OpenAI's shape.
type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// callID names the tool call made in the answer of turn t of session s;
// the tool message that answers it repeats it.
func callID(s, t int) string { return "call_" + strconv.Itoa(s) + "_" + strconv.Itoa(t) }

// chatMessages turns a turn's messages into a chat request's. answers
// holds the text each earlier turn's answer had ("" if it failed: its
// trace words stand in).
func chatMessages(s int, msgs []message, answers []string) []chatMessage {
	out := make([]chatMessage, 0, len(msgs))
	lastCall := ""
	for _, m := range msgs {
		cm := chatMessage{Role: m.Role}
		switch {
		case m.Role == "assistant":
			if m.Answer >= 0 && m.Answer < len(answers) && answers[m.Answer] != "" {
				cm.Content = strings.TrimSpace(answers[m.Answer])
			} else {
				cm.Content = wordsOf(m.IDs)
			}
			if m.ToolCall {
				tc := toolCall{ID: callID(s, m.Answer), Type: "function"}
				tc.Function.Name = toolNames[(s+m.Answer)%len(toolNames)]
				tc.Function.Arguments = `{"path": "pkg` + strconv.Itoa(s) + `/file` + strconv.Itoa(m.Answer) + `.go"}`
				cm.ToolCalls = []toolCall{tc}
				lastCall = tc.ID
			}
		case m.Role == "tool":
			cm.Content = wordsOf(m.IDs)
			cm.ToolCallID = lastCall
		default:
			cm.Content = wordsOf(m.IDs)
		}
		out = append(out, cm)
	}
	return out
}

// chatBody is the body of a streamed chat completion of a turn.
func chatBody(model string, s int, tr turn, answers []string) ([]byte, error) {
	var body bytes.Buffer
	body.WriteString(`{"model":`)
	body.WriteString(strconv.Quote(model))
	body.WriteString(`,"stream":true,"stream_options":{"include_usage":true},"max_tokens":`)
	body.WriteString(strconv.Itoa(tr.Output))
	body.WriteString(`,"tools":`)
	body.Write(agentTools)
	body.WriteString(`,"messages":`)
	msgs, err := json.Marshal(chatMessages(s, tr.Messages, answers))
	if err != nil {
		return nil, err
	}
	body.Write(msgs)
	body.WriteString("}")
	return body.Bytes(), nil
}
