package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"net"
	"net/http"
	"strings"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Catalog writes (POST /workers, PATCH and DELETE /workers/{id}) decide
// where the gateway sends prompts, so they are privileged: with a write
// token they need "Authorization: Bearer <token>"; without one they are
// accepted only from loopback clients. Reads, selections and reservations
// stay open, as in Dynamo, whose service has no authentication at all
// (docs/selection-api.md, "The write token").

// WithWriteToken requires "Authorization: Bearer <token>" on catalog
// writes: a missing header, or one of another scheme, is a 401 (with
// WWW-Authenticate: Bearer), a wrong token a 403. An empty token leaves
// catalog writes to loopback clients only. The token is compared in
// constant time (as SHA-256 digests, so its length does not leak either).
func WithWriteToken(token string) HandlerOption {
	return func(h *Handler) {
		if token == "" {
			h.writeToken = nil
			return
		}
		sum := sha256.Sum256([]byte(token))
		h.writeToken = &sum
	}
}

// authorizeWrite answers the refusal itself and reports whether a catalog
// write may go ahead.
func (h *Handler) authorizeWrite(w http.ResponseWriter, r *http.Request) bool {
	if h.writeToken == nil {
		if ip := net.ParseIP(remoteIP(r)); ip != nil && ip.IsLoopback() {
			return true
		}
		writeError(w, errorf(selection.KindForbidden, "catalog writes are accepted only from loopback clients when no write token is set; "+
			"set one (kv_selection { write_token <secret> }, or api.WithWriteToken) and send Authorization: Bearer <secret>"))
		return false
	}
	scheme, token, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	token = strings.TrimSpace(token)
	if !strings.EqualFold(scheme, "Bearer") || token == "" {
		w.Header().Set("WWW-Authenticate", "Bearer")
		writeError(w, errorf(selection.KindUnauthorized, "catalog writes need Authorization: Bearer <write token>"))
		return false
	}
	sum := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(sum[:], h.writeToken[:]) != 1 {
		writeError(w, errorf(selection.KindForbidden, "the write token is not valid"))
		return false
	}
	return true
}
