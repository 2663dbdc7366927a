package api

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"os"
	"strings"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Request bodies: checked for a JSON content type and read whole, within
// the handler's limit, into pooled buffers (docs/selection-api.md,
// "Request bodies").

// ErrBodyTooLarge is returned by ReadBody past its limit.
var ErrBodyTooLarge = &selection.Error{Kind: selection.KindTooLarge, Msg: "length limit exceeded"}

// ErrBodyTimeout is returned by ReadBody when a read deadline on the
// connection passed before the body was whole.
var ErrBodyTimeout = &selection.Error{Kind: selection.KindBadRequest, Msg: "the request body did not arrive in time"}

// IsJSONContentType accepts application/json and any +json media type.
func IsJSONContentType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")
}

// ReadBody appends all of body to buf, failing with ErrBodyTooLarge past
// limit bytes. The buffer grows with what arrives, never ahead of it: a
// declared content length is the client's claim, and a client that
// declares 16 MiB and sends a few bytes must not make the gateway hold
// 16 MiB while it waits (a hundred such connections held gigabytes). A
// known length only stops the growth at that length, so a body that
// arrives whole is not copied past its size.
func ReadBody(buf []byte, body io.Reader, limit, contentLength int64) ([]byte, error) {
	for {
		if len(buf) == cap(buf) && contentLength > 0 && int64(len(buf)) >= contentLength {
			// Every declared byte is in. Over HTTP/2 the end comes with a
			// read of its own: look for it with a byte of scratch rather
			// than with room for a body as large again.
			var probe [1]byte
			n, err := body.Read(probe[:])
			buf = append(buf, probe[:n]...)
			if done, err := bodyEnded(buf, limit, err); done {
				return buf, err
			}
			continue
		}
		if len(buf) == cap(buf) {
			grown := make([]byte, len(buf), len(buf)+bodyGrowth(len(buf), limit, contentLength))
			buf = grown[:copy(grown, buf)]
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if done, err := bodyEnded(buf, limit, err); done {
			return buf, err
		}
	}
}

// bodyEnded reports whether ReadBody stops after a read that left buf and
// returned err, and with what error.
func bodyEnded(buf []byte, limit int64, err error) (bool, error) {
	switch {
	case int64(len(buf)) > limit:
		return true, ErrBodyTooLarge
	case errors.Is(err, io.EOF):
		return true, nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return true, ErrBodyTimeout
	case err != nil:
		return true, &selection.Error{Kind: selection.KindBadRequest, Msg: "reading request body: " + err.Error()}
	}
	return false, nil
}

// bodyAhead is the most ReadBody makes room for before any byte of it has
// arrived; after that, room doubles what arrived.
const bodyAhead = 64 << 10

// bodyGrowth is how much room ReadBody adds to a full buffer holding have
// bytes: as much again as it holds (at least bodyAhead), but no more than
// the declared length still to come, nor than one byte past the limit
// (which is enough to tell that the body is over it).
func bodyGrowth(have int, limit, contentLength int64) int {
	n := int64(max(have, bodyAhead))
	if rest := contentLength - int64(have); rest > 0 {
		n = min(n, rest)
	}
	if room := limit + 1 - int64(have); room > 0 {
		n = min(n, room)
	}
	return int(max(n, 1))
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
