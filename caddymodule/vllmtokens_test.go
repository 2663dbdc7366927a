package caddymodule

import (
	"encoding/json"
	"io"
	"net/http"
)

// A stand-in for what vLLM does with a request's text, with a Llama-3-like
// chat template (which writes the BOS token itself). Token ids: the BOS
// is 1, a role header 2–5, a tool 6, and text one id per character
// (textTokens, ≥ 32). What it encodes is vLLM's documented behaviour,
// the parts that make the gateway's job harder included:
//   - chat: the template is rendered with the tools, and opens the
//     assistant's turn unless add_generation_prompt is false; the result
//     is then tokenized with add_special_tokens, false by default for
//     chat (ChatCompletionRequest and TokenizeChatRequest alike), so a
//     true adds a second BOS;
//   - completions: the prompt is tokenized with add_special_tokens, true
//     by default, which adds the BOS.

const (
	bosToken  = 1
	toolToken = 6
)

var roleTokens = map[string]uint32{"system": 2, "user": 3, "assistant": 4, "tool": 5}

// vllmChatRequest is what the template reads of a chat request.
type vllmChatRequest struct {
	Messages []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
	AddGenerationPrompt *bool  `json:"add_generation_prompt"`
	AddSpecialTokens    *bool  `json:"add_special_tokens"`
	Prompt              string `json:"prompt"`
}

// vllmChatTokens renders the template and tokenizes it as vLLM does.
func vllmChatTokens(req *vllmChatRequest) []uint32 {
	out := []uint32{bosToken} // the template's own
	for _, t := range req.Tools {
		out = append(out, toolToken)
		out = append(out, textTokens(t.Function.Name)...)
	}
	for _, m := range req.Messages {
		out = append(out, roleTokens[m.Role])
		out = append(out, textTokens(m.Content)...)
	}
	if req.AddGenerationPrompt == nil || *req.AddGenerationPrompt {
		out = append(out, roleTokens["assistant"])
	}
	if req.AddSpecialTokens != nil && *req.AddSpecialTokens {
		out = append([]uint32{bosToken}, out...) // the tokenizer's, on top
	}
	return out
}

// vllmPromptTokens tokenizes a completions prompt as vLLM does.
func vllmPromptTokens(req *vllmChatRequest) []uint32 {
	out := textTokens(req.Prompt)
	if req.AddSpecialTokens == nil || *req.AddSpecialTokens {
		out = append([]uint32{bosToken}, out...)
	}
	return out
}

// vllmTokenize is POST /tokenize: chat when the body has messages.
func vllmTokenize(rw http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	var req vllmChatRequest
	var fields map[string]json.RawMessage
	if err == nil {
		err = json.Unmarshal(b, &req)
	}
	if err == nil {
		err = json.Unmarshal(b, &fields)
	}
	if err != nil {
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	toks := vllmPromptTokens(&req)
	if _, chat := fields["messages"]; chat {
		toks = vllmChatTokens(&req)
	}
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(map[string]any{"tokens": toks, "count": len(toks)})
}
