package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	json "github.com/goccy/go-json"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Responses are JSON; an error is {"error": "<message>"} with the status
// of its selection.Kind (docs/selection-api.md, "Errors").

// kindMethod is the 405 fallback. It is local to the HTTP layer: the
// engine never answers a method, so selection.Kind has no such kind.
const kindMethod selection.Kind = -1

// The errors the routing itself answers.
var (
	errMethod      = errorf(kindMethod, "method not allowed")
	errNoRoute     = errorf(selection.KindNotFound, "route not found")
	errReplicaSync = errorf(selection.KindConflict, "replica sync is disabled")
)

func errorf(k selection.Kind, format string, args ...any) *selection.Error {
	return &selection.Error{Kind: k, Msg: fmt.Sprintf(format, args...)}
}

func reply(w http.ResponseWriter, code int, v any, err error) {
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, code, v)
}

func writeError(w http.ResponseWriter, err error) {
	code := selection.StatusOf(err)
	var e *selection.Error
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
