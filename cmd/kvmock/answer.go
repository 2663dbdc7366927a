package main

import "strconv"

// answer writes the JSON of one completion's responses by appending to a
// byte slice: a stream writes a chunk per token, and building them with
// reflection for every token would cost more CPU than the rest of the
// simulation. Only model comes from outside, and it is quoted once.
type answer struct {
	chat    bool
	id      string // "cmpl-…" or "chatcmpl-…", plain ASCII
	created int64
	model   []byte // JSON string
	prompt  int    // prompt tokens
	// cachedDetails is --enable-prompt-tokens-details: whether usage may
	// carry prompt_tokens_details.
	cachedDetails bool
}

// head appends the fields every document starts with.
func (a *answer) head(dst []byte, object string) []byte {
	dst = append(dst, `{"id":"`...)
	dst = append(dst, a.id...)
	dst = append(dst, `","object":"`...)
	dst = append(dst, object...)
	dst = append(dst, `","created":`...)
	dst = strconv.AppendInt(dst, a.created, 10)
	dst = append(dst, `,"model":`...)
	dst = append(dst, a.model...)
	return dst
}

// appendUsage appends the usage object vLLM reports. The prompt tokens
// found in the prefix cache are in prompt_tokens_details only under
// --enable-prompt-tokens-details, and even then only when there are some:
// vLLM tests the count for truth, so a request that hit nothing has no
// details at all. Where details are left out, a whole answer says
// "prompt_tokens_details":null and a stream's usage chunk has no key, as
// vLLM writes them (the chunk is written without None fields).
func (a *answer) appendUsage(dst []byte, p progress, stream bool) []byte {
	dst = append(dst, `"usage":{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(a.prompt), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(p.generated), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(a.prompt+p.generated), 10)
	switch {
	case a.cachedDetails && p.cachedTokens > 0:
		dst = append(dst, `,"prompt_tokens_details":{"cached_tokens":`...)
		dst = strconv.AppendInt(dst, int64(p.cachedTokens), 10)
		dst = append(dst, '}')
	case !stream:
		dst = append(dst, `,"prompt_tokens_details":null`...)
	}
	return append(dst, '}')
}

// finishReason is "length": generation always runs to max_tokens.
func finishReason(last bool) string {
	if last {
		return `"length"`
	}
	return "null"
}

// appendChunk appends the SSE event of output token n.
func (a *answer) appendChunk(dst []byte, n int, last bool) []byte {
	dst = append(dst, "data: "...)
	if a.chat {
		dst = a.head(dst, "chat.completion.chunk")
		dst = append(dst, `,"choices":[{"index":0,"delta":{`...)
		if n == 0 {
			dst = append(dst, `"role":"assistant",`...)
		}
		dst = append(dst, `"content":"`...)
		dst = append(dst, outputText(n)...)
		dst = append(dst, `"},"logprobs":null,"finish_reason":`...)
	} else {
		dst = a.head(dst, "text_completion")
		dst = append(dst, `,"choices":[{"index":0,"text":"`...)
		dst = append(dst, outputText(n)...)
		dst = append(dst, `","logprobs":null,"finish_reason":`...)
	}
	dst = append(dst, finishReason(last)...)
	return append(dst, "}]}\n\n"...)
}

// appendUsageChunk appends the last event before [DONE]: no choices, usage.
func (a *answer) appendUsageChunk(dst []byte, p progress) []byte {
	dst = append(dst, "data: "...)
	object := "text_completion"
	if a.chat {
		object = "chat.completion.chunk"
	}
	dst = a.head(dst, object)
	dst = append(dst, `,"choices":[],`...)
	dst = a.appendUsage(dst, p, true)
	return append(dst, "}\n\n"...)
}

// appendWhole appends the non-streamed answer.
func (a *answer) appendWhole(dst []byte, p progress) []byte {
	if a.chat {
		dst = a.head(dst, "chat.completion")
		dst = append(dst, `,"choices":[{"index":0,"message":{"role":"assistant","content":"`...)
	} else {
		dst = a.head(dst, "text_completion")
		dst = append(dst, `,"choices":[{"index":0,"text":"`...)
	}
	for n := range p.generated {
		dst = append(dst, outputText(n)...)
	}
	if a.chat {
		dst = append(dst, `"}`...)
	} else {
		dst = append(dst, `"`...)
	}
	dst = append(dst, `,"logprobs":null,"finish_reason":"length"}],`...)
	dst = a.appendUsage(dst, p, false)
	return append(dst, "}\n"...)
}
