package main

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// POST /generate, SGLang's native route, served with --api sglang. Its
// request has no model: the prompt is text (encoded as a completion's
// prompt is, with the BOS token) or input_ids, either of them a
// one-element batch too; sampling_params.max_new_tokens is the output
// length (SGLang's default, 128, when absent); lora_path and extra_key
// mean what they mean on the OpenAI routes (sglang.go). The answer is
// {"text", "meta_info"} with prompt_tokens, completion_tokens and
// cached_tokens in meta_info; a stream sends one such document per token
// as an SSE event, meta_info's counts growing, then [DONE].

// generateRequest is the part of SGLang's GenerateReqInput kvmock reads.
type generateRequest struct {
	Text           json.RawMessage `json:"text"`
	InputIDs       json.RawMessage `json:"input_ids"`
	SamplingParams struct {
		MaxNewTokens *int `json:"max_new_tokens"`
	} `json:"sampling_params"`
	Stream   bool            `json:"stream"`
	LoraPath json.RawMessage `json:"lora_path"`
	ExtraKey *string         `json:"extra_key"`
	// SGLang reads no cached block past logprob_start_len when
	// return_logprob is set; kvmock models the cap at 0 (no cache read)
	// only, and reads the whole prefix for a later start.
	ReturnLogprob   bool `json:"return_logprob"`
	LogprobStartLen *int `json:"logprob_start_len"`
}

// sglangMaxNewTokens is SGLang's default output length on /generate.
const sglangMaxNewTokens = 128

// handleGenerate serves POST /generate.
func (w *worker) handleGenerate(rw http.ResponseWriter, r *http.Request) {
	rw.Header().Set("X-Kvmock-Worker", strconv.Itoa(w.id))
	body, err := readBody(rw, r)
	var g generateRequest
	if err == nil && json.Unmarshal(body, &g) != nil {
		err = badRequest("invalid JSON body")
	}
	if err == nil && isSet(g.Text) && isSet(g.InputIDs) {
		err = badRequest("Either text or input_ids should be provided.")
	}
	// The rest is a completion's: the same prompt rules, adapter and key
	// (a null member is an absent one, as SGLang reads it).
	req := &apiRequest{Prompt: g.Text, LoraPath: g.LoraPath, ExtraKey: g.ExtraKey}
	if isSet(g.InputIDs) {
		req.Prompt = g.InputIDs
	}
	var prompt []uint32
	var lora string
	maxTokens := 0
	if err == nil {
		lora, err = w.resolveAdapter(req)
	}
	if err == nil {
		prompt, err = promptTokens(req)
	}
	if err == nil {
		maxTokens, err = w.cfg.outputLength(sglangAsk(g.SamplingParams.MaxNewTokens), len(prompt), w.cfg.contextOf(w.id))
	}
	if err != nil {
		writeError(rw, err)
		return
	}
	rq := newRequest(prompt, lora, "", w.extraKey(req), maxTokens, w.cfg.BlockSize)
	rq.seq.SkipCacheRead = g.ReturnLogprob && g.LogprobStartLen != nil && *g.LogprobStartLen == 0
	e := w.pickEngine(r)
	e.submit(rq)
	if !g.Stream {
		answerWhole(rw, r, e, rq, func(p progress) []byte { return append(appendGenerated(nil, len(prompt), p), '\n') })
		return
	}
	streamEvents(rw, r, e, rq, func(buf []byte, sent int, p progress) []byte {
		p.generated = sent + 1 // meta_info's counts as of this token
		buf = append(buf, "data: "...)
		return append(appendGenerated(buf, len(prompt), p), "\n\n"...)
	}, nil)
}

// appendGenerated appends a /generate answer: the text so far and its
// meta_info.
func appendGenerated(dst []byte, promptTokens int, p progress) []byte {
	dst = append(dst, `{"text":"`...)
	for n := range p.generated {
		dst = append(dst, outputText(n)...)
	}
	dst = append(dst, `","meta_info":{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(promptTokens), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(p.generated), 10)
	dst = append(dst, `,"cached_tokens":`...)
	dst = strconv.AppendInt(dst, int64(p.cachedTokens), 10)
	return append(dst, "}}"...)
}
