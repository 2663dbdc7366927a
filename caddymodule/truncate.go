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
	n, ok := laxInt(f.TruncatePromptTokens)
	if !ok || n < 1 || n >= int64(len(toks)) {
		return toks
	}
	if side, _ := f.TruncationSide.Text(); side == "right" {
		return toks[:n]
	}
	return toks[len(toks)-int(n):]
}
