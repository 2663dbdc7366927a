package selection

import "errors"

// Worker endpoints are where the proxy sends prompts, so a catalog write
// that sets one decides where traffic goes. WithEndpointCheck lets the host
// refuse endpoints it must never proxy to (the gateway's own listeners).

// WithEndpointCheck makes UpsertWorker and PatchWorker call fn on a
// record's HTTP endpoint when it is new or changed; an error refuses the
// write with 422 and the error's text. fn runs outside the router's locks,
// so it may resolve names or call back into the router's read methods.
func WithEndpointCheck(fn func(endpoint string) error) Option {
	return func(r *Router) { r.catalog.endpointCheck = fn }
}

// errEndpointUnchecked tells writeWorker that the catalog changed between
// its check and the commit, so the endpoint must be checked again.
var errEndpointUnchecked = errors.New("endpoint not checked")

// endpointOf is a record's HTTP endpoint, "" when it has none.
func endpointOf(w *WorkerRecord) string {
	if w == nil || w.Endpoint == nil {
		return ""
	}
	return *w.Endpoint
}

// needsEndpointCheck reports whether committing rec over old would set an
// endpoint that checked (the last endpoint fn accepted) does not cover.
func (c *Catalog) needsEndpointCheck(old, rec *WorkerRecord, checked string) bool {
	ep := endpointOf(rec)
	return c.endpointCheck != nil && ep != "" && ep != checked && (old == nil || endpointOf(old) != ep)
}

// checkEndpoint runs the endpoint check, outside every lock.
func (c *Catalog) checkEndpoint(ep string) error {
	if err := c.endpointCheck(ep); err != nil {
		return &Error{Kind: KindUnprocessable, Msg: err.Error()}
	}
	return nil
}
