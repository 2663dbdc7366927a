package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"

	json "github.com/goccy/go-json"
)

// The request side of the OpenAI/vLLM-compatible API: decoding bodies into
// prompt tokens. Large integer-array prompts are common (the benchmark
// sends 100k-token ones), hence goccy/go-json, the project's JSON library.

// maxBody bounds a request body; a 131,072-token prompt written as
// integers is under 1 MB, and text prompts are larger but not by much.
const maxBody = 64 << 20

// apiRequest is the union of the fields kvmock reads from completion,
// chat and tokenize requests. Fields whose absence means a default that
// differs per route are pointers.
type apiRequest struct {
	Model    string          `json:"model"`
	Prompt   json.RawMessage `json:"prompt"`
	TokenIDs []uint32        `json:"token_ids"` // extension: a pre-tokenized prompt
	Messages []apiMessage    `json:"messages"`
	// The fields besides the messages that the chat template reads
	// (chattemplate.go), kept raw until chatInputOf checks them.
	Tools                json.RawMessage `json:"tools"`
	Documents            json.RawMessage `json:"documents"`
	ChatTemplate         *string         `json:"chat_template"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage *bool           `json:"continue_final_message"`
	// AddSpecialTokens defaults to true for a text prompt and to false for
	// chat, where the template writes the BOS token itself.
	AddSpecialTokens *bool `json:"add_special_tokens"`
	// ReturnTokenStrs asks /tokenize for each token's text too.
	ReturnTokenStrs bool `json:"return_token_strs"`
	// MaxTokens and MaxCompletionTokens are the OpenAI spellings of the
	// output length; the second is the chat API's newer name
	// (outputlen.go).
	MaxTokens           sentInt         `json:"max_tokens"`
	MaxCompletionTokens sentInt         `json:"max_completion_tokens"`
	Stream              pyBool          `json:"stream"`
	StreamOptions       json.RawMessage `json:"stream_options"`
	// ReasoningEffort reaches the chat template on the chat route only
	// (chatInputOf).
	ReasoningEffort json.RawMessage `json:"reasoning_effort"`
	// CacheSalt puts the request's blocks in a cache of their own: vLLM
	// hashes it into the first block (so into every block after it) and
	// names it in that block's extra_keys in its KV events. A salt must be
	// a non-empty string.
	CacheSalt *string `json:"cache_salt"`
	// The members that make vLLM ask for the prompt's logprobs, and then
	// not read its prefix cache for the request (readsCache).
	PromptLogprobs json.RawMessage `json:"prompt_logprobs"`
	Echo           pyBool          `json:"echo"`
	Logprobs       json.RawMessage `json:"logprobs"`
	TopLogprobs    json.RawMessage `json:"top_logprobs"`
	// TruncatePromptTokens keeps that many of the prompt's tokens: the
	// last ones, or the first when TruncationSide is "right" (truncate).
	TruncatePromptTokens *pyInt `json:"truncate_prompt_tokens"`
	TruncationSide       string `json:"truncation_side"`
	// SGLang's adapter and cache-namespace members, read with --api
	// sglang only (sglang.go).
	LoraPath json.RawMessage `json:"lora_path"`
	ExtraKey *string         `json:"extra_key"`
}

// truncate cuts the prompt as vLLM does for truncate_prompt_tokens (-1,
// the model's length, is not modelled: kvmock's prompts fit it).
func (req *apiRequest) truncate(prompt []uint32) []uint32 {
	if req.TruncatePromptTokens == nil {
		return prompt
	}
	n := int(*req.TruncatePromptTokens)
	if n < 1 || n >= len(prompt) {
		return prompt
	}
	if req.TruncationSide == "right" {
		return prompt[:n]
	}
	return prompt[len(prompt)-n:]
}

// readsCache reports whether vLLM reads its prefix cache for the request:
// not when it asks for the prompt's logprobs, which vLLM takes from
// prompt_logprobs or, with echo, from logprobs (completions) or
// top_logprobs (chat, where it defaults to 0 and so counts unless sent as
// null). A cached prefix has no logprobs, so vLLM computes it again.
func (req *apiRequest) readsCache(chat bool) bool {
	switch {
	case isSet(req.PromptLogprobs):
		return false
	case !bool(req.Echo):
		return true
	case chat:
		return req.TopLogprobs != nil && !isSet(req.TopLogprobs)
	}
	return !isSet(req.Logprobs)
}

// apiMessage is one chat message as it arrives.
type apiMessage struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ToolCalls []struct {
		Function struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// streamOptions is the part of stream_options kvmock reads.
type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// includeUsage reports whether a stream ends with a usage chunk: when the
// request asks for it, or when the server forces it, as vLLM's
// --enable-force-include-usage does.
func (req *apiRequest) includeUsage(force bool) bool {
	if force {
		return true
	}
	var o streamOptions
	return len(req.StreamOptions) > 0 && json.Unmarshal(req.StreamOptions, &o) == nil && o.IncludeUsage
}

// checkStreamOptions refuses stream_options on a request that does not
// stream, as vLLM does (an empty object passes, as it does there).
func (req *apiRequest) checkStreamOptions() error {
	raw := bytes.TrimSpace(req.StreamOptions)
	if bool(req.Stream) || len(raw) == 0 || bytes.Equal(raw, []byte("null")) || bytes.Equal(raw, []byte("{}")) {
		return nil
	}
	return &apiError{status: http.StatusBadRequest, msg: "Stream options can only be defined when `stream=True`.", param: "stream_options"}
}

// salt returns the request's cache_salt ("" for none), refusing an empty
// one as vLLM does.
func (req *apiRequest) salt() (string, error) {
	if req.CacheSalt == nil {
		return "", nil
	}
	if *req.CacheSalt == "" {
		return "", &apiError{status: http.StatusBadRequest, msg: "Parameter 'cache_salt' must be a non-empty string if provided.", param: "cache_salt"}
	}
	return *req.CacheSalt, nil
}

// apiError is an error answer in vLLM's shape.
type apiError struct {
	status int
	msg    string
	param  string
}

// Error returns the message.
func (e *apiError) Error() string { return e.msg }

// badRequest is a 400 answer.
func badRequest(format string, a ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, a...)}
}

// readRequest decodes a request body.
func readRequest(rw http.ResponseWriter, r *http.Request) (*apiRequest, error) {
	body, err := readBody(rw, r)
	if err != nil {
		return nil, err
	}
	var req apiRequest
	if err := json.Unmarshal(exactMembers(body), &req); err != nil {
		return nil, badRequest("invalid JSON body: %v", err)
	}
	return &req, nil
}

// readBody reads a request's body, up to maxBody bytes (a 413 past it).
func readBody(rw http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, msg: "request body too large"}
		}
		return nil, badRequest("reading the body: %v", err)
	}
	return body, nil
}

// promptTokens returns the tokens of a completion prompt: the token_ids
// extension if given, else prompt as a string, an array of token ids, or a
// one-element batch of either. Batches of several prompts are refused: each
// would be its own request in vLLM, and nobody here needs them. A text
// prompt gets a BOS token in front unless add_special_tokens is false
// (vLLM's completions default is true); token ids are taken as given.
func promptTokens(req *apiRequest) ([]uint32, error) {
	if req.TokenIDs != nil {
		return req.TokenIDs, nil
	}
	raw := bytes.TrimSpace(req.Prompt)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("either prompt or token_ids is required")
	}
	text, ids, err := decodePrompt(raw)
	if err != nil || ids != nil {
		return ids, err
	}
	toks := tokenize(nil, text)
	if req.AddSpecialTokens == nil || *req.AddSpecialTokens {
		toks = withBOS(toks)
	}
	return toks, nil
}

// decodePrompt decodes a non-empty prompt value into its text or its
// token ids (never both).
func decodePrompt(raw []byte) (string, []uint32, error) { return decodePromptIn(raw, false) }

// decodePromptIn is decodePrompt; inBatch says raw is a batch's element,
// which only list[list[int]] can take when it is a list: its strings are
// ids then, not texts.
func decodePromptIn(raw []byte, inBatch bool) (string, []uint32, error) {
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", nil, badRequest("prompt: %v", err)
		}
		return s, nil, nil
	case '[':
		var ids []uint32
		if err := json.Unmarshal(raw, &ids); err == nil {
			return "", ids, nil
		}
		var batch []json.RawMessage
		if err := json.Unmarshal(raw, &batch); err != nil {
			return "", nil, badRequest("prompt must be a string, an array of token ids, or a batch of one: %v", err)
		}
		if ids, isIDs, err := laxTokenIDs(batch, inBatch); isIDs {
			return "", ids, err
		}
		if len(batch) != 1 {
			return "", nil, badRequest("batched prompts are not supported (got %d)", len(batch))
		}
		if inner := bytes.TrimSpace(batch[0]); len(inner) > 0 && (inner[0] == '"' || inner[0] == '[') {
			return decodePromptIn(inner, true)
		}
	}
	return "", nil, badRequest("prompt must be a string or an array of token ids")
}

// outputLength validates the requested output length against the
// model's context and the cache (outputlen.go).
func (c *Config) outputLength(ask outputAsk, promptLen, maxModelLen int) (int, error) {
	n := ask.n
	reach := promptLen + n // what the context must hold
	if ask.sglang {
		reach++ // SGLang refuses a total that reaches its context
	}
	switch {
	case promptLen == 0:
		return 0, badRequest("the prompt is empty")
	case ask.invalid:
		return 0, badRequest("max_tokens must be at least 1, got %d", n)
	case n == 0 && promptLen >= maxModelLen:
		return 0, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens in the messages. Please reduce the length of the messages.",
			maxModelLen, promptLen)
	case n == 0:
		n = min(ask.upTo, maxModelLen-promptLen)
	case reach > maxModelLen:
		return 0, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			maxModelLen, promptLen+n, promptLen, n)
	}
	// A request that needs more blocks than the cache has would wait at the
	// head of the queue forever and block everyone behind it.
	if need := (promptLen + n + c.BlockSize - 1) / c.BlockSize; need > c.KVBlocks {
		return 0, badRequest("the request needs %d KV blocks of %d tokens, but a worker has %d (raise --kv-blocks)",
			need, c.BlockSize, c.KVBlocks)
	}
	return n, nil
}
