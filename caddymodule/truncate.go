package caddymodule

import "github.com/kvrouter/caddy-kvrouter/selection"

// truncateFields are vLLM's request members that cut the prompt before it
// is prefilled: truncate_prompt_tokens keeps N of its tokens, the last N
// unless truncation_side is "right" (vLLM's tokenizer truncates on the
// left). /tokenize takes neither, so the gateway cuts the tokens itself:
// hashed whole, the prompt's blocks would all differ from what the engine
// caches (the kept tokens start at another position), and the request
// would be sent to a worker holding a prefix it will not read.
type truncateFields struct {
	TruncatePromptTokens selection.RawJSON `json:"truncate_prompt_tokens"`
	TruncationSide       selection.RawJSON `json:"truncation_side"`
}

// truncate returns the tokens the engine prefills of toks. A count of -1
// (the model's max_model_len) is left alone: that length is each worker's
// own, the cut is made before the worker is chosen, and a prompt within
// it is not cut.
func (f *truncateFields) truncate(toks []uint32) []uint32 {
	n := f.truncatedLength(len(toks))
	switch {
	case n == len(toks):
		return toks
	case f.cutsRight():
		return toks[:n]
	}
	return toks[len(toks)-n:]
}

// cuts reports whether the request cuts its prompt to a count of tokens.
func (f *truncateFields) cuts() bool {
	k, ok := laxInt(f.TruncatePromptTokens)
	return ok && k >= 1
}

// truncatedLength is how many tokens of a prompt of n the engine prefills.
func (f *truncateFields) truncatedLength(n int) int {
	k, ok := laxInt(f.TruncatePromptTokens)
	if !ok || k < 1 || k >= int64(n) {
		return n
	}
	return int(k)
}

// cutsRight reports whether the prompt keeps its first tokens, not its last.
func (f *truncateFields) cutsRight() bool {
	side, _ := f.TruncationSide.Text()
	return side == "right"
}
