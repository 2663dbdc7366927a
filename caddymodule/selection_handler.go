package caddymodule

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/kvrouter/caddy-kvrouter/selection/api"
)

func init() {
	caddy.RegisterModule(SelectionHandler{})
}

// SelectionHandler serves the selection API, wire-compatible with NVIDIA
// Dynamo's standalone selection service, over the kv_router app's router:
// /select, /select_and_reserve, /reservations, /workers, /health, /ready,
// /loads, /potential_loads, /overlap_scores and /dump.
//
// The routes are matched against the request path as the handler sees it,
// so to serve the API under a prefix, strip the prefix first (for example
// with handle_path). The handler is terminal: it answers every request it
// gets, with {"error": "..."} bodies and Dynamo's status codes on errors
// (404 for an unknown path), and never calls the next handler. It writes
// those error responses itself rather than returning them to Caddy, because
// clients of the API expect Dynamo's error bodies.
type SelectionHandler struct {
	// MaxBodySize is the largest request body accepted, in bytes; a larger
	// body is answered with 413. Default: 8388608 (8 MiB), as in Dynamo.
	MaxBodySize int64 `json:"max_body_size,omitempty"`

	// WriteToken, when set, is the bearer token that catalog writes (POST
	// /workers, PATCH and DELETE /workers/{id}) must carry in their
	// Authorization header: without it they get 401, with another token
	// 403. Placeholders are replaced at load time, so the secret can stay
	// out of the config: write_token {env.KVROUTER_WRITE_TOKEN}. A token
	// that comes out empty is a config error, so a missing variable never
	// opens the catalog. Without write_token, catalog writes are accepted
	// from loopback clients only. Reads, selections and reservations are
	// open, as in Dynamo. Default: unset.
	WriteToken string `json:"write_token,omitempty"`

	api *api.Handler
}

// CaddyModule returns the Caddy module information.
func (SelectionHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.kv_selection",
		New: func() caddy.Module { return new(SelectionHandler) },
	}
}

// Provision binds the handler to the kv_router app's router. An absent app
// is created with default settings.
func (h *SelectionHandler) Provision(ctx caddy.Context) error {
	if err := h.Validate(); err != nil {
		return err
	}
	app, err := kvApp(ctx)
	if err != nil {
		return err
	}
	router := app.Router()
	maxBody := h.MaxBodySize
	if maxBody == 0 {
		maxBody = api.DefaultMaxBodyBytes
	}
	var opts []api.HandlerOption
	if h.WriteToken != "" {
		token := caddy.NewReplacer().ReplaceKnown(h.WriteToken, "")
		if token == "" {
			return fmt.Errorf("write_token %q is empty once its placeholders are replaced (is the environment variable set?)", h.WriteToken)
		}
		opts = append(opts, api.WithWriteToken(token))
	}
	h.api = api.NewHandler(router, maxBody, opts...)
	return nil
}

// Validate checks the handler's settings.
func (h *SelectionHandler) Validate() error {
	if h.MaxBodySize < 0 {
		return errors.New("max_body_size must not be negative")
	}
	return nil
}

// ServeHTTP answers the request from the selection API.
func (h *SelectionHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	h.api.ServeHTTP(w, r)
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*SelectionHandler)(nil)
	_ caddy.Validator             = (*SelectionHandler)(nil)
	_ caddyhttp.MiddlewareHandler = (*SelectionHandler)(nil)
)
