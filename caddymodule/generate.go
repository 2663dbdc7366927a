package caddymodule

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// generateFields are what the gateway reads of SGLang's native
// POST /generate (docs/sglang.md, step 2b): its prompt, as token ids
// in input_ids (read by the fast token decoder: InputIDs) or as text,
// either of them a one-element batch too, and the members that cap how
// much of the prompt SGLang reads from its cache. The request has no
// model: the catalog's only model serves it (handler.go), and lora_path
// and extra_key mean what they mean on SGLang's OpenAI routes
// (sglangfields.go).
type generateFields struct {
	Text        selection.RawJSON `json:"text"`
	RawInputIDs selection.RawJSON `json:"input_ids"` // a batch; integer arrays go to inputIDs
	// SGLang computes the prompt's logprobs from logprob_start_len on when
	// return_logprob is set, and reads no cached block past that
	// position: a prefix of which the gateway does not model the cap.
	ReturnLogprob   selection.RawJSON `json:"return_logprob"`
	LogprobStartLen selection.RawJSON `json:"logprob_start_len"`

	inputIDs []uint32
}

// InputIDs implements selection.InputIDsCarrier.
func (g *generateFields) InputIDs() *[]uint32 { return &g.inputIDs }

// isGenerate reports whether r is for SGLang's /generate.
func isGenerate(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, "/generate") }

// capsCacheRead reports whether SGLang reads less of its cache for the
// request than the prompt's cached prefix: return_logprob with a
// logprob_start_len of 0 or more (-1, its default, asks for none of the
// prompt's logprobs).
func (g *generateFields) capsCacheRead() bool {
	if !onlyItem(g.ReturnLogprob).IsTrue() {
		return false
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(onlyItem(g.LogprobStartLen))), 10, 64)
	return err == nil && n >= 0
}

// generatePrompt is a /generate request's prompt: token ids, or text to
// tokenize as a completion prompt. ok is false when there is none the
// gateway can read (a batch of several; both text and input_ids, which
// SGLang versions refuse or read differently; or neither).
func (g *generateFields) generatePrompt() (text selection.RawJSON, ids []uint32, ok bool) {
	hasIDs := g.inputIDs != nil || g.RawInputIDs.IsSet()
	switch {
	case hasIDs && g.Text.IsSet():
		return nil, nil, false
	case g.inputIDs != nil:
		return nil, g.inputIDs, true
	case g.RawInputIDs.IsArray():
		_, ids, ok := promptOfOne(g.RawInputIDs, false)
		return nil, ids, ok && ids != nil
	case g.Text.IsString():
		return g.Text, nil, true
	case g.Text.IsArray():
		text, _, ok := promptOfOne(g.Text, false)
		return text, nil, ok && text != nil
	}
	return nil, nil, false
}
