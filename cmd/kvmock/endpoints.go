package main

import (
	"net/http"
	"strconv"
)

// The small vLLM endpoints besides completions: POST /tokenize, which the
// gateway uses to turn text and chat messages into the same tokens the
// workers will see, and GET /v1/models.

// handleTokenize answers vLLM's /tokenize: {"prompt": …} or
// {"messages": […]} in, {"count", "max_model_len", "tokens"} out. Messages
// are rendered with the chat template exactly as /v1/chat/completions
// renders them, generation prompt included unless switched off.
func (w *worker) handleTokenize(rw http.ResponseWriter, r *http.Request) {
	req, err := readRequest(rw, r)
	if err == nil {
		err = w.cfg.checkModel(req.Model)
	}
	var tokens []uint32
	if err == nil {
		if req.Messages != nil {
			tokens, err = chatTokens(req)
		} else {
			tokens, err = promptTokens(req)
		}
	}
	if err != nil {
		writeError(rw, err)
		return
	}
	b := make([]byte, 0, 64+len(tokens)*7)
	b = append(b, `{"count":`...)
	b = strconv.AppendInt(b, int64(len(tokens)), 10)
	b = append(b, `,"max_model_len":`...)
	b = strconv.AppendInt(b, int64(w.cfg.MaxModelLen), 10)
	b = append(b, `,"tokens":[`...)
	for i, t := range tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(t), 10)
	}
	b = append(b, `],"token_strs":null}`...)
	rw.Header().Set("Content-Type", "application/json")
	_, _ = rw.Write(b)
}

// handleModels lists the one served model, as OpenAI clients expect.
func (w *worker) handleModels(rw http.ResponseWriter, _ *http.Request) {
	b := []byte(`{"object":"list","data":[{"id":`)
	b = append(b, w.modelJSON()...)
	b = append(b, `,"object":"model","owned_by":"kvmock","max_model_len":`...)
	b = strconv.AppendInt(b, int64(w.cfg.MaxModelLen), 10)
	b = append(b, "}]}"...)
	rw.Header().Set("Content-Type", "application/json")
	_, _ = rw.Write(b)
}
