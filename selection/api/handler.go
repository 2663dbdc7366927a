package api

import (
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// DefaultMaxBodyBytes is Dynamo's request body limit.
const DefaultMaxBodyBytes = 8 << 20

// Handler serves the selection API for a Router (docs/selection-api.md).
type Handler struct {
	router     *selection.Router
	maxBody    int64
	writeToken *[32]byte // SHA-256 of the catalog write token, nil without one
	bodies     sync.Pool // *[]byte read buffers
	selects    sync.Pool // *selection.SelectRequest, reused with their token buffers
	// dumping lets one GET /dump run at a time; the others wait their
	// turn (dump.go says why).
	dumping chan struct{}
	// A dump's write bounds (dumpWriteTimeout, dumpTimeout; tests
	// shorten them).
	dumpWriteTimeout, dumpTimeout time.Duration
}

// HandlerOption customises a Handler.
type HandlerOption func(*Handler)

// NewHandler returns the API handler. maxBody ≤ 0 means DefaultMaxBodyBytes.
// Catalog writes are privileged (auth.go): see WithWriteToken.
func NewHandler(r *selection.Router, maxBody int64, opts ...HandlerOption) *Handler {
	if maxBody <= 0 {
		maxBody = DefaultMaxBodyBytes
	}
	h := &Handler{router: r, maxBody: maxBody, dumping: make(chan struct{}, 1), dumpWriteTimeout: dumpWriteTimeout, dumpTimeout: dumpTimeout}
	for _, o := range opts {
		o(h)
	}
	h.bodies.New = func() any { b := make([]byte, 0, 64<<10); return &b }
	h.selects.New = func() any { return new(selection.SelectRequest) }
	return h
}

// ServeHTTP implements http.Handler: the routes of docs/selection-api.md
// ("Routes"), a trailing slash ignored.
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
		h.routeReservation(w, r)
	case path == "/workers":
		switch r.Method {
		case http.MethodPost:
			if h.authorizeWrite(w, r) {
				h.handleUpsert(w, r)
			}
		case http.MethodGet, http.MethodHead:
			q := r.URL.Query()
			writeJSON(w, http.StatusOK, h.router.Catalog().ListWorkers(q.Get("model_name"), q.Get("routing_group")))
		default:
			writeError(w, errMethod)
		}
	case strings.HasPrefix(path, "/workers/"):
		h.routeWorker(w, r, strings.TrimPrefix(path, "/workers/"))
	case path == "/health":
		h.method(w, r, http.MethodGet, func() { writeJSON(w, http.StatusOK, statusOK) })
	case path == "/ready":
		h.method(w, r, http.MethodGet, func() {
			rr := h.router.Catalog().Ready()
			code := http.StatusOK
			if !rr.Ready {
				code = http.StatusServiceUnavailable
			}
			writeJSON(w, code, rr)
		})
	case path == "/loads":
		h.method(w, r, http.MethodGet, func() {
			q := r.URL.Query()
			writeJSON(w, http.StatusOK, h.router.Queries().Loads(q.Get("model_name"), q.Get("routing_group")))
		})
	case path == "/potential_loads":
		h.method(w, r, http.MethodPost, func() { handleScore(h, w, r, h.router.Queries().PotentialLoads) })
	case path == "/overlap_scores":
		h.method(w, r, http.MethodPost, func() { handleScore(h, w, r, h.router.Queries().OverlapScores) })
	case path == "/dump":
		h.method(w, r, http.MethodGet, func() { h.serveDump(w, r) })
	case path == "/replica_sync/register_peer" || path == "/replica_sync/deregister_peer":
		// Mounted as in Dynamo, which answers 409 while replica sync is
		// not configured; here it is not implemented yet.
		h.method(w, r, http.MethodPost, func() { writeError(w, errReplicaSync) })
	case path == "/replica_sync/peers":
		// Dynamo lists no peers while replica sync is off (200 []),
		// where the two writes above are 409s.
		h.method(w, r, http.MethodGet, func() { writeJSON(w, http.StatusOK, []string{}) })
	default:
		writeError(w, errNoRoute)
	}
}

var statusOK = map[string]string{"status": "ok"}

// method serves fn when the request's method is want; a GET route answers
// HEAD too, as Dynamo's (axum's) do, and net/http leaves the body out.
func (h *Handler) method(w http.ResponseWriter, r *http.Request, want string, fn func()) {
	if r.Method != want && (want != http.MethodGet || r.Method != http.MethodHead) {
		writeError(w, errMethod)
		return
	}
	fn()
}

// routeReservation serves /reservations/{id}[/action]. The id is one
// segment of the path as sent, unescaped after the split (as axum's path
// parameters are): an id with a slash, sent as %2F, is its own, where
// splitting the decoded path found no route for it and its booking held
// its rank's load until reservation_ttl.
func (h *Handler) routeReservation(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(strings.TrimSuffix(r.URL.EscapedPath(), "/"), "/reservations/")
	if !ok {
		writeError(w, errNoRoute)
		return
	}
	escapedID, action, _ := strings.Cut(rest, "/")
	id, err := url.PathUnescape(escapedID)
	switch {
	case err != nil || id == "":
		writeError(w, errNoRoute)
	case action == "":
		h.method(w, r, http.MethodDelete, func() { reply(w, http.StatusOK, statusOK, h.router.Free(id)) })
	case action == "prefill_complete":
		h.method(w, r, http.MethodPost, func() { reply(w, http.StatusOK, statusOK, h.router.PrefillComplete(id)) })
	case action == "output_block":
		h.method(w, r, http.MethodPost, func() {
			var req selection.OutputBlockRequest
			// The body is optional: only one that is there is read.
			if r.ContentLength != 0 || r.Header.Get("Content-Type") != "" {
				if !h.decodePlain(w, r, &req) {
					return
				}
			}
			reply(w, http.StatusOK, statusOK, h.router.AddOutputBlock(id, req.DecayFraction))
		})
	default:
		writeError(w, errNoRoute)
	}
}

func (h *Handler) routeWorker(w http.ResponseWriter, r *http.Request, rest string) {
	// Authorization comes first, so an unauthorised client learns nothing
	// about which ids parse.
	if (r.Method == http.MethodPatch || r.Method == http.MethodDelete) && !h.authorizeWrite(w, r) {
		return
	}
	id, err := strconv.ParseUint(rest, 10, 64)
	if err != nil {
		if strings.Contains(rest, "/") {
			writeError(w, errNoRoute)
		} else {
			writeError(w, errorf(selection.KindBadRequest, "Invalid URL: Cannot parse `%s` to a `u64`", rest))
		}
		return
	}
	switch r.Method {
	case http.MethodPatch:
		var req selection.WorkerRequest
		if h.decodePlain(w, r, &req) {
			rec, err := h.router.Catalog().PatchWorker(id, &req)
			if err == nil {
				h.router.Catalog().Shared(&rec)
			}
			reply(w, http.StatusOK, rec, err)
		}
	case http.MethodDelete:
		rec, err := h.router.Catalog().DeleteWorker(id)
		if err == nil {
			h.router.Catalog().SharedDelete(id)
		}
		reply(w, http.StatusOK, rec, err)
	default:
		writeError(w, errMethod)
	}
}

func (h *Handler) handleSelect(w http.ResponseWriter, r *http.Request, book bool) {
	req := h.selects.Get().(*selection.SelectRequest)
	defer func() {
		// Keep only the token buffer's capacity for the next request.
		tokens := req.TokenIDs[:0]
		*req = selection.SelectRequest{}
		req.TokenIDs = tokens
		h.selects.Put(req)
	}()
	if !h.decode(w, r, func(b []byte) error { return selection.DecodeJSON(b, req) }) {
		return
	}
	req.Client = remoteIP(r)
	var res *selection.SelectResponse
	var err error
	if book {
		res, err = h.router.SelectAndReserve(req)
	} else {
		res, err = h.router.Select(req)
	}
	reply(w, http.StatusOK, res, err)
}

// handleScore answers a scoring query (POST /potential_loads,
// /overlap_scores) from its decoded body.
func handleScore[T any](h *Handler, w http.ResponseWriter, r *http.Request, query func(*selection.ScoreRequest) (T, error)) {
	var req selection.ScoreRequest
	if h.decode(w, r, func(b []byte) error { return selection.DecodeJSON(b, &req) }) {
		res, err := query(&req)
		reply(w, http.StatusOK, res, err)
	}
}

func (h *Handler) handleReservation(w http.ResponseWriter, r *http.Request) {
	var req selection.ReservationRequest
	if !h.decode(w, r, func(b []byte) error { return selection.DecodeJSON(b, &req) }) {
		return
	}
	if req.SelectionID == nil {
		writeError(w, selection.ShapeError("missing field `selection_id`"))
		return
	}
	req.Client = remoteIP(r)
	res, err := h.router.CreateReservation(&req)
	reply(w, http.StatusCreated, res, err)
}

func (h *Handler) handleUpsert(w http.ResponseWriter, r *http.Request) {
	var req selection.WorkerRequest
	if !h.decodePlain(w, r, &req) {
		return
	}
	if req.WorkerID == nil {
		writeError(w, selection.ShapeError("missing field `worker_id`"))
		return
	}
	rec, err := h.router.Catalog().UpsertWorker(&req)
	if err == nil {
		h.router.Catalog().Shared(&rec)
	}
	reply(w, http.StatusCreated, rec, err)
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
