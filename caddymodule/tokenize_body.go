package caddymodule

import (
	"bytes"

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
		{"chat_template_kwargs", o.ChatTemplateKwargs, ""},
		{"continue_final_message", o.ContinueFinalMessage, ""},
		{"documents", o.Documents, ""},
		{"add_generation_prompt", o.AddGenerationPrompt, "true"},
		{"add_special_tokens", o.AddSpecialTokens, "false"},
	})
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
		if len(v) == 0 || string(v) == "null" {
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
