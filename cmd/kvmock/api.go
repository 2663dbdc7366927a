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
// chat and tokenize requests.
type apiRequest struct {
	Model    string          `json:"model"`
	Prompt   json.RawMessage `json:"prompt"`
	TokenIDs []uint32        `json:"token_ids"` // extension: a pre-tokenized prompt
	Messages []apiMessage    `json:"messages"`
	// MaxTokens and MaxCompletionTokens are the OpenAI spellings of the
	// output length; the second is the chat API's newer name.
	MaxTokens           *int  `json:"max_tokens"`
	MaxCompletionTokens *int  `json:"max_completion_tokens"`
	Stream              bool  `json:"stream"`
	AddGenerationPrompt *bool `json:"add_generation_prompt"`
}

// apiMessage is one chat message as it arrives.
type apiMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
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
	body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, msg: "request body too large"}
		}
		return nil, badRequest("reading the body: %v", err)
	}
	var req apiRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, badRequest("invalid JSON body: %v", err)
	}
	return &req, nil
}

// checkModel answers vLLM's 404 for a model the fleet does not serve; an
// absent model means the served one, as vLLM accepts too.
func (c *Config) checkModel(model string) error {
	if model != "" && model != c.Model {
		return &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("The model `%s` does not exist.", model), param: "model"}
	}
	return nil
}

// promptTokens returns the tokens of a completion prompt: the token_ids
// extension if given, else prompt as a string, an array of token ids, or a
// one-element batch of either. Batches of several prompts are refused: each
// would be its own request in vLLM, and nobody here needs them.
func promptTokens(req *apiRequest) ([]uint32, error) {
	if req.TokenIDs != nil {
		return req.TokenIDs, nil
	}
	raw := bytes.TrimSpace(req.Prompt)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("either prompt or token_ids is required")
	}
	return decodePrompt(raw)
}

// decodePrompt decodes a non-empty prompt value.
func decodePrompt(raw []byte) ([]uint32, error) {
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, badRequest("prompt: %v", err)
		}
		return tokenize(nil, s), nil
	case '[':
		var ids []uint32
		if err := json.Unmarshal(raw, &ids); err == nil {
			return ids, nil
		}
		var batch []json.RawMessage
		if err := json.Unmarshal(raw, &batch); err != nil {
			return nil, badRequest("prompt must be a string, an array of token ids, or a batch of one: %v", err)
		}
		if len(batch) != 1 {
			return nil, badRequest("batched prompts are not supported (got %d)", len(batch))
		}
		if inner := bytes.TrimSpace(batch[0]); len(inner) > 0 && (inner[0] == '"' || inner[0] == '[') {
			return decodePrompt(inner)
		}
	}
	return nil, badRequest("prompt must be a string or an array of token ids")
}

// chatTokens renders and tokenizes chat messages.
func chatTokens(req *apiRequest) ([]uint32, error) {
	if len(req.Messages) == 0 {
		return nil, badRequest("messages is required")
	}
	msgs := make([]chatMessage, len(req.Messages))
	for i, m := range req.Messages {
		text, err := messageText(m.Content)
		if err != nil {
			return nil, badRequest("messages[%d].content: %v", i, err)
		}
		msgs[i] = chatMessage{Role: m.Role, Content: text}
	}
	gen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
	return tokenize(nil, renderChat(msgs, gen)), nil
}

// messageText is a message's content: a string, or the text parts of a
// list of parts joined by spaces. Other parts (images) have no tokens here.
func messageText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
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
	var b bytes.Buffer
	for _, p := range parts {
		if p.Type == "text" {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(p.Text)
		}
	}
	return b.String(), nil
}

// outputLength validates the requested output length against the
// defaults and the model and cache limits.
func (c *Config) outputLength(req *apiRequest, promptLen int) (int, error) {
	n := c.MaxTokens
	if req.MaxCompletionTokens != nil {
		n = *req.MaxCompletionTokens
	}
	if req.MaxTokens != nil {
		n = *req.MaxTokens
	}
	switch {
	case promptLen == 0:
		return 0, badRequest("the prompt is empty")
	case n < 1:
		return 0, badRequest("max_tokens must be at least 1, got %d", n)
	case promptLen+n > c.MaxModelLen:
		return 0, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			c.MaxModelLen, promptLen+n, promptLen, n)
	}
	// A request that needs more blocks than the cache has would wait at the
	// head of the queue forever and block everyone behind it.
	if need := (promptLen + n + c.BlockSize - 1) / c.BlockSize; need > c.KVBlocks {
		return 0, badRequest("the request needs %d KV blocks of %d tokens, but a worker has %d (raise --kv-blocks)",
			need, c.BlockSize, c.KVBlocks)
	}
	return n, nil
}
