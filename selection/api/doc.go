// Package api serves a selection.Router over HTTP with the routes, request
// and response bodies, statuses and error bodies of NVIDIA Dynamo's
// standalone selection service (docs/selection-api.md). Handler is a plain
// http.Handler, so any Go server, or Caddy's kv_selection handler, can
// mount it:
//
//	r, _ := selection.NewRouter(selection.DefaultConfig())
//	http.ListenAndServe("127.0.0.1:8092", api.NewHandler(r, 0))
//
// The engine stays HTTP-free: decoding, error kinds and their statuses
// are selection's (selection.DecodeJSON, selection.StatusOf); this package
// adds routing, body reading, the write token and streaming of the dump.
//
// # Catalog writes
//
// POST /workers, PATCH /workers/{id} and DELETE /workers/{id} are
// privileged: with WithWriteToken they need "Authorization: Bearer
// <token>" (401 without, 403 with a wrong one); without a token they are
// accepted from loopback clients only (403 otherwise). Reads, selections
// and reservations are open, as in Dynamo.
package api
