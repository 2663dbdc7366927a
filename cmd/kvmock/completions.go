package main

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	json "github.com/goccy/go-json"
)

// The completion endpoints: POST /v1/completions and
// POST /v1/chat/completions, each answered as one JSON document or, with
// "stream": true, as server-sent events with one chunk per output token.
// Usage is reported as vLLM reports it: always in the JSON answer; in a
// stream, in a last chunk with no choices before [DONE] only when the
// request sets stream_options.include_usage (or the fleet runs with
// --enable-force-include-usage); and with prompt_tokens_details.cached_tokens
// only under --enable-prompt-tokens-details (answer.go).

// handleCompletions serves POST /v1/completions.
func (w *worker) handleCompletions(rw http.ResponseWriter, r *http.Request) {
	w.complete(rw, r, false)
}

// handleChat serves POST /v1/chat/completions.
func (w *worker) handleChat(rw http.ResponseWriter, r *http.Request) {
	w.complete(rw, r, true)
}

// complete decodes a completion request, hands it to an engine and
// answers as the request asked.
func (w *worker) complete(rw http.ResponseWriter, r *http.Request, chat bool) {
	rw.Header().Set("X-Kvmock-Worker", strconv.Itoa(w.id))
	prompt, lora, req, err := w.decodeCompletion(rw, r, chat)
	var maxTokens int
	if err == nil {
		maxTokens, err = w.cfg.outputLength(w.cfg.vllmAsk(req, chat), len(prompt), w.cfg.contextOf(w.id))
	}
	if err != nil {
		writeError(rw, err)
		return
	}
	// Hashing in newRequest, on the handler's goroutine, keeps the
	// per-worker scheduler free for scheduling.
	salt, err := req.salt()
	if err != nil {
		writeError(rw, err)
		return
	}
	rq := newRequest(prompt, lora, salt, w.extraKey(req), maxTokens, w.cfg.BlockSize)
	rq.seq.SkipCacheRead = !req.readsCache(chat)
	e := w.pickEngine(r)
	rw.Header().Set("X-Kvmock-Dp-Rank", strconv.Itoa(e.dpRank))
	e.submit(rq)

	// vLLM answers with the name the request used: an adapter's for a
	// LoRA request.
	name := w.cfg.Model
	if lora != "" {
		name = lora
	}
	model, _ := json.Marshal(name)
	out := &answer{chat: chat, created: time.Now().Unix(), model: model, prompt: len(prompt),
		cachedDetails: w.cfg.EnablePromptTokensDetails}
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	out.id = prefix + strconv.Itoa(w.id) + "-" + strconv.FormatUint(w.nextID.Add(1), 10)
	if req.Stream {
		w.stream(rw, r, e, rq, out, req.includeUsage(w.cfg.EnableForceIncludeUsage))
	} else {
		w.whole(rw, r, e, rq, out)
	}
}

// decodeCompletion reads a completion request and its prompt tokens, and
// the LoRA adapter that serves it ("" for the base model).
func (w *worker) decodeCompletion(rw http.ResponseWriter, r *http.Request, chat bool) ([]uint32, string, *apiRequest, error) {
	req, err := readRequest(rw, r)
	if err != nil {
		return nil, "", nil, err
	}
	lora, err := w.resolveAdapter(req)
	if err == nil {
		err = req.checkStreamOptions()
	}
	if err != nil {
		return nil, "", req, err
	}
	if !chat {
		prompt, err := promptTokens(req)
		return req.truncate(prompt), lora, req, err
	}
	in, err := chatInputOf(req, true)
	if err != nil {
		return nil, "", req, err
	}
	return req.truncate(chatTokens(req, in)), lora, req, nil
}

// wait blocks until the request has more than sent tokens or is done. It
// reports false when the client went away, after telling the scheduler.
func wait(ctx context.Context, e *engine, rq *request, sent int) (progress, bool) {
	for {
		p := rq.snapshot()
		if p.done || p.generated > sent {
			return p, true
		}
		select {
		case <-rq.wake:
		case <-ctx.Done():
			rq.aborted.Store(true)
			e.poke()
			return p, false
		case <-e.done:
			// The engine stopped; whatever it did not finish never will.
			if p = rq.snapshot(); !p.done {
				p.done, p.err = true, errStopped
			}
			return p, true
		}
	}
}

// whole answers with one JSON document once generation is over.
func (w *worker) whole(rw http.ResponseWriter, r *http.Request, e *engine, rq *request, out *answer) {
	answerWhole(rw, r, e, rq, func(p progress) []byte { return out.appendWhole(nil, p) })
}

// answerWhole writes the JSON document doc makes of the request's progress
// once generation is over.
func answerWhole(rw http.ResponseWriter, r *http.Request, e *engine, rq *request, doc func(progress) []byte) {
	// Waiting for more than maxTokens tokens returns only when done.
	p, ok := wait(r.Context(), e, rq, rq.seq.MaxTokens)
	if !ok {
		return
	}
	if p.err != nil {
		// A restarted or stopped engine process takes its connections with it.
		panic(http.ErrAbortHandler)
	}
	rw.Header().Set("Content-Type", "application/json")
	rw.Header().Set("X-Kvmock-Cached-Tokens", strconv.Itoa(p.cachedTokens))
	_, _ = rw.Write(doc(p))
}

// stream answers with server-sent events, OpenAI's chunks.
func (w *worker) stream(rw http.ResponseWriter, r *http.Request, e *engine, rq *request, out *answer, withUsage bool) {
	var usage func([]byte, progress) []byte
	if withUsage {
		usage = out.appendUsageChunk
	}
	streamEvents(rw, r, e, rq, func(buf []byte, sent int, p progress) []byte {
		return out.appendChunk(buf, sent, p.done && sent+1 == p.generated)
	}, usage)
}

// streamEvents answers with server-sent events: event appends those of
// the token at index sent (of p's), end (when not nil) those that follow
// the last token, and [DONE] ends the stream. Nothing, not even the
// headers, is sent before the first token: a gateway may take the first
// byte as the end of prefill.
func streamEvents(rw http.ResponseWriter, r *http.Request, e *engine, rq *request,
	event func(buf []byte, sent int, p progress) []byte, end func(buf []byte, p progress) []byte) {
	rc := http.NewResponseController(rw)
	sent := 0
	var buf []byte
	for {
		p, ok := wait(r.Context(), e, rq, sent)
		if !ok {
			return
		}
		if p.err != nil {
			panic(http.ErrAbortHandler)
		}
		if sent == 0 {
			h := rw.Header()
			h.Set("Content-Type", "text/event-stream")
			h.Set("Cache-Control", "no-cache")
			h.Set("X-Kvmock-Cached-Tokens", strconv.Itoa(p.cachedTokens))
		}
		buf = buf[:0]
		for ; sent < p.generated; sent++ {
			buf = event(buf, sent, p)
		}
		if p.done {
			if end != nil {
				buf = end(buf, p)
			}
			buf = append(buf, "data: [DONE]\n\n"...)
		}
		_, err := rw.Write(buf)
		if err == nil {
			err = rc.Flush()
		}
		if err != nil {
			rq.aborted.Store(true)
			e.poke()
			return
		}
		if p.done {
			return
		}
	}
}

// writeError answers in vLLM's error shape.
func writeError(rw http.ResponseWriter, err error) {
	ae, ok := errors.AsType[*apiError](err)
	if !ok {
		ae = &apiError{status: http.StatusInternalServerError, msg: err.Error()}
	}
	typ := "BadRequestError"
	switch ae.status {
	case http.StatusNotFound:
		typ = "NotFoundError"
	case http.StatusRequestEntityTooLarge:
		typ = "RequestEntityTooLarge"
	case http.StatusInternalServerError:
		typ = "InternalServerError"
	}
	body := map[string]any{"object": "error", "message": ae.msg, "type": typ, "param": nil, "code": ae.status}
	if ae.param != "" {
		body["param"] = ae.param
	}
	b, _ := json.Marshal(body)
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(ae.status)
	_, _ = rw.Write(b)
}
