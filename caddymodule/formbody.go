package caddymodule

import (
	"bytes"
	"errors"
	"mime"
	"net/http"
	"strings"
)

// vLLM's audio routes (/v1/audio/transcriptions and translations) take a
// multipart form, not JSON: the file and its fields, model among them.
// Such a request has no prompt the gateway could hash (the engine makes
// its tokens from the audio), so it is routed by load to a worker of the
// form's model; its body goes on as it came.
//
// The form is read as vLLM's server (Starlette) reads it, so that the
// request goes to a worker of the model the engine will serve: only a
// multipart/form-data body, the last model field when there are several,
// a part's name taken from its Content-Disposition whatever the
// disposition's type, and no Content-Transfer-Encoding decoded. Other
// routes are read as JSON whatever their Content-Type says (SGLang reads
// its JSON so; vLLM refuses such a body), so that a Content-Type does not
// take a request past the JSON checks.

// maxFormModel bounds the model field read from a form, as a model name
// is bounded everywhere else; maxFormParts the parts looked at (vLLM's
// forms have a dozen fields); maxFormPartHeader a part's header block
// (a Content-Disposition and a Content-Type take a few hundred bytes).
// Only a part's Content-Disposition is parsed: Go's multipart reader made
// a map of every part's headers, and 64 parts of 9,990 headers each cost
// 126 MB of allocations and 0.2 s of CPU a 5 MB request.
const (
	maxFormModel      = 256
	maxFormParts      = 64
	maxFormPartHeader = 8 << 10
)

// isForm reports whether r is a multipart form on a route that takes one,
// and the form's boundary.
func isForm(r *http.Request) (boundary string, ok bool) {
	if !takesForm(r) {
		return "", false
	}
	ct := r.Header.Get("Content-Type")
	if !strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), "multipart/form-data") {
		return "", false
	}
	typ, params, err := mime.ParseMediaType(ct)
	if err != nil || typ != "multipart/form-data" || params["boundary"] == "" {
		return "", false
	}
	return params["boundary"], true
}

// takesForm reports whether r's route is one vLLM serves from a form.
func takesForm(r *http.Request) bool {
	p := r.URL.Path
	return strings.HasSuffix(p, "/audio/transcriptions") || strings.HasSuffix(p, "/audio/translations")
}

var (
	errFormUnreadable = errors.New("the body is not a multipart form of its Content-Type's boundary")
	errFormParts      = errors.New("the form has more than 64 parts")
	errFormPartHeader = errors.New("a part's headers in the form are over 8 KiB, or not ended")
	errFormModelSize  = errors.New("the form's model field is over 256 bytes")
)

// formModel reads the form's model field (the last one), "" when it has
// none. Each part is found by the boundary; the body is already in
// memory, bounded by max_body_size, and nothing of it is copied but the
// model.
func formModel(body []byte, boundary string) (string, error) {
	delim := []byte("--" + boundary)
	if !bytes.HasPrefix(body, delim) {
		// Starlette's parser takes no preamble before the first delimiter.
		return "", errFormUnreadable
	}
	rest := body[len(delim):]
	next := append([]byte("\r\n"), delim...) // a part's end
	model := ""
	for parts := 0; ; parts++ {
		if bytes.HasPrefix(rest, []byte("--")) {
			return model, nil // the closing delimiter
		}
		// Nor blanks after a delimiter (RFC 2046's transport padding).
		if !bytes.HasPrefix(rest, []byte("\r\n")) {
			return "", errFormUnreadable
		}
		rest = rest[2:]
		if parts == maxFormParts {
			return "", errFormParts
		}
		header := []byte(nil)
		if !bytes.HasPrefix(rest, []byte("\r\n")) {
			end := bytes.Index(rest[:min(len(rest), maxFormPartHeader)], []byte("\r\n\r\n"))
			if end < 0 {
				return "", errFormPartHeader
			}
			header, rest = rest[:end], rest[end+2:]
		}
		rest = rest[2:] // the blank line after the headers
		end := bytes.Index(rest, next)
		if end < 0 {
			return "", errFormUnreadable
		}
		if partName(header) == "model" {
			if end > maxFormModel {
				return "", errFormModelSize
			}
			model = string(rest[:end])
		}
		rest = rest[end+len(next):]
	}
}

// partName is the name parameter of a part's Content-Disposition (its
// last one), "" when it has none.
func partName(header []byte) string {
	name := ""
	for line := range bytes.SplitSeq(header, []byte("\r\n")) {
		key, value, ok := bytes.Cut(line, []byte(":"))
		if ok && strings.EqualFold(string(bytes.TrimSpace(key)), "content-disposition") {
			name = dispositionName(string(value))
		}
	}
	return name
}

// dispositionName is a Content-Disposition's name parameter. Starlette's
// reading is more lenient than RFC 2183's: it takes the parameters of a
// value with no disposition type ("; name=model") or with a parameter of
// no value beside them, which Go's parser refuses; those are read
// parameter by parameter, the last name winning.
func dispositionName(value string) string {
	if _, params, err := mime.ParseMediaType(value); err == nil {
		return params["name"]
	}
	name := ""
	params := strings.Split(value, ";")
	for _, p := range params[1:] {
		k, v, ok := strings.Cut(p, "=")
		if ok && strings.EqualFold(strings.TrimSpace(k), "name") {
			v = strings.TrimSpace(v)
			if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
				v = v[1 : len(v)-1]
			}
			name = v
		}
	}
	return name
}
