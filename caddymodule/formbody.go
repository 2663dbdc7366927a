package caddymodule

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strings"
)

// vLLM's audio routes (/v1/audio/transcriptions and translations) take a
// multipart form, not JSON: the file and its fields, model among them.
// Such a request has no prompt the gateway could hash (the engine makes
// its tokens from the audio), so it is routed by load to a worker of the
// form's model; its body goes on as it came.

// maxFormModel bounds the model field read from a form, as a model name
// is bounded everywhere else; maxFormParts the parts looked at for it
// (vLLM's forms have a dozen fields): each part read costs its headers'
// map, and a body of 16 MiB held a million empty parts (455 MB allocated
// reading them, 0.8 s).
const (
	maxFormModel = 256
	maxFormParts = 64
)

// isForm reports whether r's body is a multipart form, and its boundary.
func isForm(r *http.Request) (boundary string, ok bool) {
	ct := r.Header.Get("Content-Type")
	if !strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), "multipart/") {
		return "", false
	}
	_, params, err := mime.ParseMediaType(ct)
	if err != nil || params["boundary"] == "" {
		return "", false
	}
	return params["boundary"], true
}

// formModel reads the form's model field, "" when it has none. The parts
// before it (the file, typically after it) are skipped, not kept: the
// body is already in memory, bounded by max_body_size.
func formModel(body []byte, boundary string) (string, error) {
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	for range maxFormParts {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return "", nil
		}
		if err != nil {
			return "", err
		}
		if p.FormName() != "model" {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(p, maxFormModel+1))
		if err != nil {
			return "", err
		}
		if len(b) > maxFormModel {
			return "", errors.New("the form's model field is over 256 bytes")
		}
		return string(b), nil
	}
	return "", errors.New("no model field in the form's first 64 parts")
}
