package main

import (
	"fmt"
	"net/http"
	"strconv"

	json "github.com/goccy/go-json"
)

// POST /tokenize, as vLLM serves it: the gateway turns text prompts and
// chat messages into the tokens a worker will prefill through it. Two
// forms, told apart by messages:
//
//	{model, prompt, add_special_tokens (default true), return_token_strs}
//	{model, messages, tools, chat_template, chat_template_kwargs,
//	 add_generation_prompt (default true), continue_final_message (default
//	 false), add_special_tokens (default false), return_token_strs}
//
// Like vLLM's, the chat form has no documents field (one sent is ignored);
// documents reach its template through chat_template_kwargs, as the chat
// route's documents do.
//
// and one answer, {count, max_model_len, tokens, token_strs}. The chat form
// renders the template exactly as /v1/chat/completions does, so the two
// agree unless --tokenize-skew says otherwise.

// TokenizeSkew is a deliberate disagreement between /tokenize and the
// completion routes.
type TokenizeSkew string

// The skews --tokenize-skew offers.
const (
	// SkewNone: /tokenize answers what the completion routes prefill.
	SkewNone TokenizeSkew = "none"
	// SkewBOS: the chat form's answer lacks the BOS token the template
	// writes, like a tokenizer service that strips special tokens.
	SkewBOS TokenizeSkew = "bos"
	// SkewTemplate: the chat form renders the template without the
	// tools, like a tokenizer that ignores fields it does not know.
	SkewTemplate TokenizeSkew = "template"
)

// validate refuses an unknown skew.
func (s TokenizeSkew) validate() error {
	switch s {
	case SkewNone, SkewBOS, SkewTemplate:
		return nil
	}
	return fmt.Errorf("--tokenize-skew must be none, bos or template, not %q", string(s))
}

// handleTokenize serves POST /tokenize.
func (w *worker) handleTokenize(rw http.ResponseWriter, r *http.Request) {
	req, err := readRequest(rw, r)
	if err == nil {
		_, err = w.resolveAdapter(req)
	}
	var tokens []uint32
	var strs []string
	if err == nil {
		tokens, strs, err = w.tokenizeRequest(req)
	}
	if err != nil {
		writeError(rw, err)
		return
	}
	b := make([]byte, 0, 64+len(tokens)*7)
	b = append(b, `{"count":`...)
	b = strconv.AppendInt(b, int64(len(tokens)), 10)
	b = append(b, `,"max_model_len":`...)
	b = strconv.AppendInt(b, int64(w.cfg.contextOf(w.id)), 10)
	b = append(b, `,"tokens":[`...)
	for i, t := range tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(t), 10)
	}
	b = append(b, `],"token_strs":`...)
	if strs == nil {
		b = append(b, "null"...)
	} else {
		js, _ := json.Marshal(strs)
		b = append(b, js...)
	}
	b = append(b, '}')
	rw.Header().Set("Content-Type", "application/json")
	_, _ = rw.Write(b)
}

// tokenizeRequest returns the tokens of either form, and their texts when
// return_token_strs asks for them. The completion form's prompt must be a
// string, as vLLM's TokenizeCompletionRequest wants.
func (w *worker) tokenizeRequest(req *apiRequest) ([]uint32, []string, error) {
	if req.Messages == nil {
		var text string
		if err := json.Unmarshal(req.Prompt, &text); err != nil || !isSet(req.Prompt) {
			return nil, nil, &apiError{status: http.StatusBadRequest, msg: "prompt must be a string (or give messages)", param: "prompt"}
		}
		bos := req.AddSpecialTokens == nil || *req.AddSpecialTokens
		tokens, strs := tokensOf(text, bos, req.ReturnTokenStrs)
		return tokens, strs, nil
	}
	in, err := chatInputOf(req, false)
	if err != nil {
		return nil, nil, err
	}
	if w.cfg.TokenizeSkew == SkewTemplate {
		in.Tools = nil
	}
	text := renderChat(in)
	if w.cfg.TokenizeSkew == SkewBOS {
		// The text starts with the BOS token the template writes.
		text = text[len("<|begin_of_text|>"):]
	}
	tokens, strs := tokensOf(text, req.AddSpecialTokens != nil && *req.AddSpecialTokens, req.ReturnTokenStrs)
	return tokens, strs, nil
}

// tokensOf tokenizes text, with BOS in front when bos is set, and returns
// the tokens' texts too when strs is set.
func tokensOf(text string, bos, strs bool) ([]uint32, []string) {
	var tokens []uint32
	var texts []string
	if bos {
		tokens = append(tokens, tokBOS)
		if strs {
			texts = append(texts, specialText[tokBOS])
		}
	}
	eachToken(text, func(id uint32, s string) {
		tokens = append(tokens, id)
		if strs {
			texts = append(texts, s)
		}
	})
	if strs && texts == nil {
		texts = []string{}
	}
	return tokens, texts
}
