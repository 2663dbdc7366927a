package selection

import (
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	json "github.com/goccy/go-json"
)

// The HTTP API (spec §1.2): Dynamo's selection service routes over a Router,
// as a plain http.Handler so any Go server (or Caddy's kv_selection
// handler) can serve it.

// DefaultMaxBodyBytes is Dynamo's request body limit.
const DefaultMaxBodyBytes = 8 << 20

// Handler serves the selection API for a Router.
type Handler struct {
	router     *Router
	maxBody    int64
	writeToken *[32]byte // SHA-256 of the catalog write token, nil without one
	bodies     sync.Pool // *[]byte read buffers
	selects    sync.Pool // *SelectRequest, reused with their token buffers
}

// HandlerOption customises a Handler.
type HandlerOption func(*Handler)

// NewHandler returns the API handler. maxBody ≤ 0 means DefaultMaxBodyBytes.
// Catalog writes are privileged (auth.go): see WithWriteToken.
func NewHandler(r *Router, maxBody int64, opts ...HandlerOption) *Handler {
	if maxBody <= 0 {
		maxBody = DefaultMaxBodyBytes
	}
	h := &Handler{router: r, maxBody: maxBody}
	for _, o := range opts {
		o(h)
	}
	h.bodies.New = func() any { b := make([]byte, 0, 64<<10); return &b }
	h.selects.New = func() any { return new(SelectRequest) }
	return h
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimSuffix(r.URL.Path, "/")
	if path == "" {
		path = "/"
	}
	switch {
	case path == "/select":
		h.method(w, r, http.MethodPost, func() { h.handleSelect(w, r, false) })
	case path == "/select_and_reserve":
		h.method(w, r, http.MethodPost, func() { h.handleSelect(w, r, true) })
	case path == "/reservations":
		h.method(w, r, http.MethodPost, func() { h.handleReservation(w, r) })
	case strings.HasPrefix(path, "/reservations/"):
		h.routeReservation(w, r, strings.TrimPrefix(path, "/reservations/"))
	case path == "/workers":
		switch r.Method {
		case http.MethodPost:
			if h.authorizeWrite(w, r) {
				h.handleUpsert(w, r)
			}
		case http.MethodGet:
			q := r.URL.Query()
			writeJSON(w, http.StatusOK, h.router.ListWorkers(q.Get("model_name"), q.Get("routing_group")))
		default:
			writeError(w, errorf(kindMethod, "method not allowed"))
		}
	case strings.HasPrefix(path, "/workers/"):
		h.routeWorker(w, r, strings.TrimPrefix(path, "/workers/"))
	case path == "/health":
		h.method(w, r, http.MethodGet, func() { writeJSON(w, http.StatusOK, statusOK) })
	case path == "/ready":
		h.method(w, r, http.MethodGet, func() {
			rr := h.router.Ready()
			code := http.StatusOK
			if !rr.Ready {
				code = http.StatusServiceUnavailable
			}
			writeJSON(w, code, rr)
		})
	case path == "/loads":
		h.method(w, r, http.MethodGet, func() {
			q := r.URL.Query()
			writeJSON(w, http.StatusOK, h.router.Loads(q.Get("model_name"), q.Get("routing_group")))
		})
	case path == "/potential_loads":
		h.method(w, r, http.MethodPost, func() {
			var req ScoreRequest
			if h.decode(w, r, &req) {
				res, err := h.router.PotentialLoads(&req)
				reply(w, http.StatusOK, res, err)
			}
		})
	case path == "/overlap_scores":
		h.method(w, r, http.MethodPost, func() {
			var req ScoreRequest
			if h.decode(w, r, &req) {
				res, err := h.router.OverlapScores(&req)
				reply(w, http.StatusOK, res, err)
			}
		})
	case path == "/dump":
		h.method(w, r, http.MethodGet, func() { h.serveDump(w) })
	case path == "/replica_sync/register_peer" || path == "/replica_sync/deregister_peer":
		// Mounted as in Dynamo, which answers 409 while replica sync is
		// not configured; here it is not implemented yet.
		h.method(w, r, http.MethodPost, func() { writeError(w, errorf(KindConflict, "replica sync is disabled")) })
	case path == "/replica_sync/peers":
		h.method(w, r, http.MethodGet, func() { writeError(w, errorf(KindConflict, "replica sync is disabled")) })
	default:
		writeError(w, errorf(KindNotFound, "route not found"))
	}
}

var statusOK = map[string]string{"status": "ok"}

// kindMethod is the 405 fallback, local to the HTTP layer.
const kindMethod Kind = -1

func (h *Handler) method(w http.ResponseWriter, r *http.Request, want string, fn func()) {
	if r.Method != want {
		writeError(w, errorf(kindMethod, "method not allowed"))
		return
	}
	fn()
}

func (h *Handler) routeReservation(w http.ResponseWriter, r *http.Request, rest string) {
	id, action, _ := strings.Cut(rest, "/")
	switch {
	case id == "":
		writeError(w, errorf(KindNotFound, "route not found"))
	case action == "":
		h.method(w, r, http.MethodDelete, func() { reply(w, http.StatusOK, statusOK, h.router.Free(id)) })
	case action == "prefill_complete":
		h.method(w, r, http.MethodPost, func() { reply(w, http.StatusOK, statusOK, h.router.PrefillComplete(id)) })
	case action == "output_block":
		h.method(w, r, http.MethodPost, func() {
			var req OutputBlockRequest
			if r.ContentLength != 0 || r.Header.Get("Content-Type") != "" {
				if !h.decodePlain(w, r, &req) {
					return
				}
			}
			reply(w, http.StatusOK, statusOK, h.router.AddOutputBlock(id, req.DecayFraction))
		})
	default:
		writeError(w, errorf(KindNotFound, "route not found"))
	}
}

func (h *Handler) routeWorker(w http.ResponseWriter, r *http.Request, rest string) {
	if (r.Method == http.MethodPatch || r.Method == http.MethodDelete) && !h.authorizeWrite(w, r) {
		return
	}
	id, err := strconv.ParseUint(rest, 10, 64)
	if err != nil {
		if strings.Contains(rest, "/") {
			writeError(w, errorf(KindNotFound, "route not found"))
		} else {
			writeError(w, errorf(KindBadRequest, "Invalid URL: Cannot parse `%s` to a `u64`", rest))
		}
		return
	}
	switch r.Method {
	case http.MethodPatch:
		var req WorkerRequest
		if h.decodePlain(w, r, &req) {
			rec, err := h.router.PatchWorker(id, &req)
			reply(w, http.StatusOK, rec, err)
		}
	case http.MethodDelete:
		rec, err := h.router.DeleteWorker(id)
		reply(w, http.StatusOK, rec, err)
	default:
		writeError(w, errorf(kindMethod, "method not allowed"))
	}
}

func (h *Handler) handleSelect(w http.ResponseWriter, r *http.Request, book bool) {
	req := h.selects.Get().(*SelectRequest)
	defer func() {
		// Keep only the token buffer's capacity for the next request.
		tokens := req.TokenIDs[:0]
		*req = SelectRequest{}
		req.TokenIDs = tokens
		h.selects.Put(req)
	}()
	if !h.decode(w, r, req) {
		return
	}
	req.Client = remoteIP(r)
	var res *SelectResponse
	var err error
	if book {
		res, err = h.router.SelectAndReserve(req)
	} else {
		res, err = h.router.Select(req)
	}
	reply(w, http.StatusOK, res, err)
}

func (h *Handler) handleReservation(w http.ResponseWriter, r *http.Request) {
	var req ReservationRequest
	if !h.decode(w, r, &req) {
		return
	}
	if req.SelectionID == nil {
		writeError(w, &Error{Kind: KindUnprocessable, Msg: shapePrefix + "missing field `selection_id`"})
		return
	}
	req.Client = remoteIP(r)
	res, err := h.router.CreateReservation(&req)
	reply(w, http.StatusCreated, res, err)
}

func (h *Handler) handleUpsert(w http.ResponseWriter, r *http.Request) {
	var req WorkerRequest
	if !h.decodePlain(w, r, &req) {
		return
	}
	if req.WorkerID == nil {
		writeError(w, &Error{Kind: KindUnprocessable, Msg: shapePrefix + "missing field `worker_id`"})
		return
	}
	rec, err := h.router.UpsertWorker(&req)
	reply(w, http.StatusCreated, rec, err)
}

// readBody checks the content type and reads the body within the limit
// into a pooled buffer. The caller must give the buffer back.
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request) (*[]byte, bool) {
	if !IsJSONContentType(r.Header.Get("Content-Type")) {
		writeError(w, &Error{Kind: KindUnsupportedMedia, Msg: "Expected request with `Content-Type: application/json`"})
		return nil, false
	}
	if r.ContentLength > h.maxBody {
		writeError(w, &Error{Kind: KindTooLarge, Msg: "length limit exceeded"})
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

// decode reads and decodes a prompt-carrying body; it answers the error
// itself and reports whether decoding succeeded.
func (h *Handler) decode(w http.ResponseWriter, r *http.Request, v promptCarrier) bool {
	bufp, ok := h.readBody(w, r)
	if !ok {
		return false
	}
	defer h.bodies.Put(bufp)
	if err := DecodeJSON(*bufp, v); err != nil {
		writeError(w, err)
		return false
	}
	return true
}

// decodePlain reads and decodes a body that carries no prompt.
func (h *Handler) decodePlain(w http.ResponseWriter, r *http.Request, v any) bool {
	bufp, ok := h.readBody(w, r)
	if !ok {
		return false
	}
	defer h.bodies.Put(bufp)
	if err := goccyDecode(*bufp, v); err != nil {
		writeError(w, err)
		return false
	}
	return true
}

// remoteIP is the client's address without its port: the key of its
// reservation bound.
func remoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// IsJSONContentType accepts application/json and any +json media type.
func IsJSONContentType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")
}

// ErrBodyTooLarge is returned by ReadBody past its limit.
var ErrBodyTooLarge = &Error{Kind: KindTooLarge, Msg: "length limit exceeded"}

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
			return buf, &Error{Kind: KindBadRequest, Msg: "reading request body: " + err.Error()}
		}
	}
}

func reply(w http.ResponseWriter, code int, v any, err error) {
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, code, v)
}

func writeError(w http.ResponseWriter, err error) {
	code := StatusOf(err)
	var e *Error
	if errors.As(err, &e) && e.Kind == kindMethod {
		code = http.StatusMethodNotAllowed
	}
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code = http.StatusInternalServerError
		b = []byte(`{"error":"encoding response"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(code)
	_, _ = w.Write(b)
}
