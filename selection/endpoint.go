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
	return func(r *Router) { r.endpointCheck = fn }
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
func (r *Router) needsEndpointCheck(old, rec *WorkerRecord, checked string) bool {
	ep := endpointOf(rec)
	return r.endpointCheck != nil && ep != "" && ep != checked && (old == nil || endpointOf(old) != ep)
}

// checkEndpoint runs the endpoint check, outside every lock.
func (r *Router) checkEndpoint(ep string) error {
	if err := r.endpointCheck(ep); err != nil {
		return &Error{Kind: KindUnprocessable, Msg: err.Error()}
	}
	return nil
}

// forgetServer drops what the router knows of the server behind old's
// endpoint, as if the worker had been deleted: its index entries, its
// bookings (their load and their ids), its sessions' bindings, the
// selections pending on it and its failure history. A worker whose
// endpoint changes is another server: none of this is true of it, and
// keeping its cached prefixes would send its sessions' next turns (and
// their context) to whoever registered the new endpoint.
func (r *Router) forgetServer(old *WorkerRecord) {
	id := old.WorkerID
	r.index.RemoveWorker(old.Partition(), id)
	var gone []*booking
	r.resMu.Lock()
	for sid, b := range r.reservations {
		if b != nil && b.rs.rank.WorkerID == id {
			gone = append(gone, r.takeLocked(sid))
		}
	}
	r.resMu.Unlock()
	for _, b := range gone {
		r.release(b)
	}
	if r.affinity.enabled() {
		r.affinity.forgetWorker(id)
	}
	r.pending.dropWorker(id)
	r.health.forget(id)
}
