package main

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"

	json "github.com/goccy/go-json"
)

// From a chat request to the template's input, with vLLM's defaults and
// the checks vLLM makes before rendering (a refused request is a 400,
// never a prompt rendered some other way).

// chatInputOf reads the chat template's input from req. onChatRoute says
// the request is a chat completion, where vLLM refuses an empty tools
// array; its /tokenize takes one as no tools.
func chatInputOf(req *apiRequest, onChatRoute bool) (*chatInput, error) {
	if len(req.Messages) == 0 {
		return nil, badRequest("messages is required")
	}
	in := &chatInput{
		Messages:             make([]chatMessage, len(req.Messages)),
		AddGenerationPrompt:  req.AddGenerationPrompt == nil || *req.AddGenerationPrompt,
		ContinueFinalMessage: req.ContinueFinalMessage != nil && *req.ContinueFinalMessage,
	}
	if in.AddGenerationPrompt && in.ContinueFinalMessage {
		return nil, badRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	for i, m := range req.Messages {
		if m.Role == "" {
			return nil, badRequest("messages[%d].role is required", i)
		}
		text, err := messageText(m.Content)
		if err != nil {
			return nil, badRequest("messages[%d].content: %v", i, err)
		}
		in.Messages[i] = chatMessage{Role: m.Role, Content: text}
		for _, c := range m.ToolCalls {
			args, err := argumentsText(c.Function.Arguments)
			if err != nil {
				return nil, badRequest("messages[%d].tool_calls: %v", i, err)
			}
			in.Messages[i].ToolCalls = append(in.Messages[i].ToolCalls, toolCall{Name: c.Function.Name, Arguments: args})
		}
	}
	var err error
	if in.Tools, err = toolsOf(req.Tools, onChatRoute); err != nil {
		return nil, err
	}
	// The template's variables are vLLM's: documents from the chat
	// route's documents field (vLLM's /tokenize has no such field and
	// ignores it), then chat_template_kwargs over them, so a documents
	// key there wins, on either route.
	documents := req.Documents
	if !onChatRoute {
		documents = nil
	}
	// vLLM's chat route also hands the template a reasoning_effort, and
	// enable_thinking true unless the effort is "none", under the
	// client's kwargs (its /tokenize has no reasoning_effort field).
	if effort := bytes.TrimSpace(req.ReasoningEffort); onChatRoute && len(effort) > 0 && effort[0] == '"' {
		in.Kwargs = map[string]json.RawMessage{"reasoning_effort": effort,
			"enable_thinking": json.RawMessage(strconv.FormatBool(string(effort) != `"none"`))}
	}
	if isSet(req.ChatTemplateKwargs) {
		var kwargs map[string]json.RawMessage
		if err := json.Unmarshal(req.ChatTemplateKwargs, &kwargs); err != nil {
			return nil, badRequest("chat_template_kwargs must be an object: %v", err)
		}
		if in.Kwargs == nil {
			in.Kwargs = kwargs
		}
		for k, v := range kwargs {
			in.Kwargs[k] = v
		}
		if d, ok := in.Kwargs["documents"]; ok {
			documents = d
		}
	}
	if isSet(documents) {
		if err := json.Unmarshal(documents, &in.Documents); err != nil {
			return nil, badRequest("documents must be a list of objects of strings: %v", err)
		}
	}
	if req.ChatTemplate != nil {
		in.Template = *req.ChatTemplate
	}
	return in, nil
}

// chatTokens renders a chat and tokenizes the text, with a BOS token in
// front only when add_special_tokens asks for one (vLLM's chat default is
// false: the template wrote one already).
func chatTokens(req *apiRequest, in *chatInput) []uint32 {
	toks := tokenize(nil, renderChat(in))
	if req.AddSpecialTokens != nil && *req.AddSpecialTokens {
		toks = withBOS(toks)
	}
	return toks
}

// isSet reports whether a raw field is present and not null.
func isSet(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && !bytes.Equal(raw, []byte("null"))
}

// toolsOf checks the tools field: a list of function tools, each with a
// name. Each is kept as its raw JSON, which the template writes out.
func toolsOf(raw json.RawMessage, onChatRoute bool) ([]json.RawMessage, error) {
	if !isSet(raw) {
		return nil, nil
	}
	var tools []json.RawMessage
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, &apiError{status: http.StatusBadRequest, msg: "tools must be a list of tools: " + err.Error(), param: "tools"}
	}
	if len(tools) == 0 && onChatRoute {
		return nil, &apiError{status: http.StatusBadRequest,
			msg:   "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.",
			param: "tools"}
	}
	for i, t := range tools {
		var def struct {
			Function *struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if err := json.Unmarshal(t, &def); err != nil || def.Function == nil || def.Function.Name == "" {
			return nil, &apiError{status: http.StatusBadRequest, msg: "tools[" + strconv.Itoa(i) + "] must be a function with a name", param: "tools"}
		}
	}
	return tools, nil
}

// messageText is a message's content: a string, or the text parts of a
// list of parts joined by new lines, as vLLM joins them for a template
// that takes string content. Other parts (images) have no tokens here.
func messageText(raw json.RawMessage) (string, error) {
	if !isSet(raw) {
		return "", nil
	}
	raw = bytes.TrimSpace(raw)
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", err
	}
	var texts []string
	for _, p := range parts {
		if p.Type == "text" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// argumentsText is a tool call's arguments as the template writes them:
// OpenAI sends a JSON string holding JSON, which is written as it is; an
// object (some clients send one) is written as compact JSON.
func argumentsText(raw json.RawMessage) (string, error) {
	if !isSet(raw) {
		return "{}", nil
	}
	raw = bytes.TrimSpace(raw)
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return "", err
	}
	return b.String(), nil
}
