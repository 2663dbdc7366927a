package main

import "encoding/json"

// How each engine route reads the answer's length and checks it against
// the worker's context (max_model_len), as the engines do:
//
//   - vLLM's /v1/completions: max_tokens, 16 when the member is absent; a
//     null one asks for what the context leaves (the prompt must leave
//     room for one token); a value below 1 is refused. The prompt and the
//     answer must fit the context.
//   - vLLM's /v1/chat/completions: max_completion_tokens or max_tokens, as
//     Python's "or" reads them (null and 0 fall through to the next);
//     neither asks for what the context leaves.
//   - SGLang's /generate: sampling_params.max_new_tokens (128 when absent,
//     checked then only as a prompt that must leave room); SGLang refuses a
//     prompt that reaches its context, and one whose max_new_tokens takes
//     it there.

// sentInt is an optional integer member that remembers whether it was
// sent at all: vLLM's completions tell an absent max_tokens (16) from a
// null one (what the context leaves).
type sentInt struct {
	sent bool
	v    *pyInt // nil: null, or not sent
}

func (s *sentInt) UnmarshalJSON(b []byte) error {
	s.sent = true
	return json.Unmarshal(b, &s.v)
}

// truthy is the value when Python's "or" would take it: set and not 0.
func (s sentInt) truthy() (int, bool) {
	if s.v == nil || *s.v == 0 {
		return 0, false
	}
	return int(*s.v), true
}

// outputAsk is what a request asks of its answer's length.
type outputAsk struct {
	// n is the tokens asked for; 0 asks for what the context leaves, at
	// most upTo (the mock has no end-of-text token to stop at).
	n, upTo int
	// invalid marks a length the engine refuses (below 1).
	invalid bool
	// sglang checks as SGLang does: refused when the total reaches the
	// context, where vLLM refuses past it.
	sglang bool
}

// vllmAsk reads req's output length as vLLM's completion routes do.
func (c *Config) vllmAsk(req *apiRequest, chat bool) outputAsk {
	var n int
	var ok bool
	switch {
	case chat:
		if n, ok = req.MaxCompletionTokens.truthy(); !ok {
			n, ok = req.MaxTokens.truthy()
		}
	case !req.MaxTokens.sent:
		n, ok = c.MaxTokens, true
	case req.MaxTokens.v != nil:
		n, ok = int(*req.MaxTokens.v), true
	}
	if !ok {
		return outputAsk{upTo: c.MaxTokens}
	}
	return outputAsk{n: n, invalid: n < 1}
}

// sglangAsk reads /generate's sampling_params.max_new_tokens.
func sglangAsk(maxNew *int) outputAsk {
	if maxNew == nil {
		return outputAsk{upTo: sglangMaxNewTokens, sglang: true}
	}
	return outputAsk{n: *maxNew, invalid: *maxNew < 1, sglang: true}
}
