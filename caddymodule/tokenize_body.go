package caddymodule

import (
	"bytes"
	"strconv"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// The /tokenize request must produce the tokens the engine will prefill,
// or every cached block is missed without an error anywhere. vLLM's chat
// path renders the chat template, which already writes the BOS token, and
// then tokenizes with add_special_tokens false; its completions path
// tokenizes the prompt with add_special_tokens true. The template reads
// more of the request than the messages: the tools, a per-request
// template and its arguments, whether to open the assistant's turn or
// continue the last message, and retrieved documents. So the body sent to
// /tokenize carries every one of those fields as the client sent it, and
// the engine's defaults for the two that decide special tokens when the
// client left them out, rather than relying on /tokenize's own defaults
// (which are the same in vLLM, but are not everywhere).
//
// Two fields need more than passing on. vLLM's chat route hands the
// request's documents and its reasoning_effort to the template along with
// chat_template_kwargs (the kwargs win on a clash), but its /tokenize has
// neither field and would drop them; so they travel inside
// chat_template_kwargs, where both render them (templateKwargs). SGLang's
// /tokenize takes messages too, and its chat route also reads tool_choice
// (tools reach the template only when it is not "none") and
// reasoning_effort; they are passed on at the top level too when the
// client sent them, which vLLM's /tokenize ignores.

// templateFields are the request fields, besides the messages or the
// prompt, that the engine's chat template or tokenizer reads. Each is
// kept raw: the gateway never interprets them, it only passes them on.
type templateFields struct {
	Tools                selection.RawJSON `json:"tools"`
	ChatTemplate         selection.RawJSON `json:"chat_template"`
	ChatTemplateKwargs   selection.RawJSON `json:"chat_template_kwargs"`
	AddGenerationPrompt  selection.RawJSON `json:"add_generation_prompt"`
	ContinueFinalMessage selection.RawJSON `json:"continue_final_message"`
	Documents            selection.RawJSON `json:"documents"`
	AddSpecialTokens     selection.RawJSON `json:"add_special_tokens"`
	ToolChoice           selection.RawJSON `json:"tool_choice"`
	ReasoningEffort      selection.RawJSON `json:"reasoning_effort"`
}

// chatTokenizeBody is the /tokenize body for a chat request: the model,
// the messages and every template field the client gave, with vLLM's chat
// defaults (add_generation_prompt true, add_special_tokens false) for the
// two that are absent.
func chatTokenizeBody(o *openAIRequest) []byte {
	return tokenizeBody(o.Model, []bodyField{
		{"messages", o.Messages, ""},
		{"tools", o.Tools, ""},
		{"chat_template", o.ChatTemplate, ""},
		{"chat_template_kwargs", templateKwargs(o.ChatTemplateKwargs, o.Documents, o.ReasoningEffort), ""},
		{"continue_final_message", o.ContinueFinalMessage, ""},
		{"tool_choice", o.ToolChoice, ""},
		{"reasoning_effort", o.ReasoningEffort, ""},
		{"add_generation_prompt", o.AddGenerationPrompt, "true"},
		{"add_special_tokens", o.AddSpecialTokens, "false"},
	})
}

// templateKwargs is the chat_template_kwargs sent to /tokenize: the
// client's, after what vLLM's chat route adds to them and its /tokenize
// would not: the request's documents under "documents", and a
// reasoning_effort under "reasoning_effort", with "enable_thinking" true
// unless the effort is "none" (vLLM does so since 0.2x, so that a
// template that shows thinking only when asked, as Gemma's and Qwen's
// do, renders it). The client's kwargs come after, so they win on a
// clash, as they do in vLLM (of two equal keys in a JSON object, both
// engines keep the last). Kwargs that are not an object are passed as
// they are, for the engine to refuse as its chat route would.
func templateKwargs(kwargs, documents, effort selection.RawJSON) selection.RawJSON {
	var added [][2]string
	if documents.IsSet() {
		added = append(added, [2]string{"documents", string(bytes.TrimSpace(documents))})
	}
	if e, ok := effort.Text(); ok {
		added = append(added, [2]string{"reasoning_effort", string(bytes.TrimSpace(effort))},
			[2]string{"enable_thinking", strconv.FormatBool(e != "none")})
	}
	if len(added) == 0 {
		return kwargs
	}
	kw := bytes.TrimSpace(kwargs)
	if !kwargs.IsSet() {
		kw = []byte("{}")
	}
	if kw[0] != '{' || kw[len(kw)-1] != '}' {
		return kwargs
	}
	inner := bytes.TrimSpace(kw[1 : len(kw)-1])
	out := make([]byte, 0, len(inner)+64)
	for i, kv := range added {
		if i == 0 {
			out = append(out, '{')
		} else {
			out = append(out, ',')
		}
		out = append(append(append(append(out, '"'), kv[0]...), '"', ':'), kv[1]...)
	}
	if len(inner) > 0 {
		out = append(out, ',')
		out = append(out, inner...)
	}
	return append(out, '}')
}

// completionTokenizeBody is the /tokenize body for a text prompt, with
// vLLM's completions default (add_special_tokens true) when absent.
func completionTokenizeBody(o *openAIRequest) []byte {
	return tokenizeBody(o.Model, []bodyField{
		{"prompt", o.RawPrompt, ""},
		{"add_special_tokens", o.AddSpecialTokens, "true"},
	})
}

// bodyField is one field of a /tokenize body: the client's value, and the
// default sent when the client sent none (or null); with no default, an
// absent field stays absent.
type bodyField struct {
	name  string
	value selection.RawJSON
	def   string
}

// tokenizeBody writes {"model": model, fields...} in order.
func tokenizeBody(model string, fields []bodyField) []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":`)
	b.WriteString(quoteJSON(model))
	for _, f := range fields {
		v := bytes.TrimSpace(f.value)
		if !f.value.IsSet() {
			if f.def == "" {
				continue
			}
			v = []byte(f.def)
		}
		b.WriteString(`,"` + f.name + `":`)
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes()
}
