package api

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Request bodies: checked for a JSON content type and read whole, within
// the handler's limit, into pooled buffers (docs/selection-api.md,
// "Request bodies").

// ErrBodyTooLarge is returned by ReadBody past its limit.
var ErrBodyTooLarge = &selection.Error{Kind: selection.KindTooLarge, Msg: "length limit exceeded"}

// IsJSONContentType accepts application/json and any +json media type.
func IsJSONContentType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")
}

// ReadBody appends all of body to buf, failing with ErrBodyTooLarge past
// limit bytes. A known content length sizes the buffer once.
func ReadBody(buf []byte, body io.Reader, limit, contentLength int64) ([]byte, error) {
	if contentLength > 0 && int64(cap(buf)) < contentLength {
		buf = make([]byte, 0, contentLength)
	}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			return buf, ErrBodyTooLarge
		}
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return buf, &selection.Error{Kind: selection.KindBadRequest, Msg: "reading request body: " + err.Error()}
		}
	}
}

// readBody checks the content type and reads the body within the limit
// into a pooled buffer. The caller must give the buffer back.
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request) (*[]byte, bool) {
	if !IsJSONContentType(r.Header.Get("Content-Type")) {
		writeError(w, &selection.Error{Kind: selection.KindUnsupportedMedia, Msg: "Expected request with `Content-Type: application/json`"})
		return nil, false
	}
	if r.ContentLength > h.maxBody {
		// Refused before reading a byte of it.
		writeError(w, ErrBodyTooLarge)
		return nil, false
	}
	bufp := h.bodies.Get().(*[]byte)
	buf, err := ReadBody((*bufp)[:0], r.Body, h.maxBody, r.ContentLength)
	*bufp = buf
	if err != nil {
		h.bodies.Put(bufp)
		writeError(w, err)
		return nil, false
	}
	return bufp, true
}

// decode reads the body and hands it to decodeFn (which must not keep
// it: the buffer goes back to the pool). It answers the error itself and
// reports whether decoding succeeded.
func (h *Handler) decode(w http.ResponseWriter, r *http.Request, decodeFn func(body []byte) error) bool {
	bufp, ok := h.readBody(w, r)
	if !ok {
		return false
	}
	defer h.bodies.Put(bufp)
	if err := decodeFn(*bufp); err != nil {
		writeError(w, err)
		return false
	}
	return true
}

// decodePlain reads and decodes a body that carries no prompt.
func (h *Handler) decodePlain(w http.ResponseWriter, r *http.Request, v any) bool {
	return h.decode(w, r, func(b []byte) error { return selection.UnmarshalPlain(b, v) })
}
