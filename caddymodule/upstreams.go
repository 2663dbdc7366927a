package caddymodule

import (
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

func init() {
	caddy.RegisterModule(Upstreams{})
}

// Upstreams is dynamic kv_router: reverse_proxy's upstreams are the
// schedulable workers of the kv_router app's catalog, so a worker added
// through POST /workers receives traffic without a reload, and a deleted or
// incomplete one stops receiving it. Each worker is a real upstream, so
// health checks, circuit breaking and upstream metrics work per worker.
type Upstreams struct {
	router *selection.Router
	cache  *dialCache
}

// dialCache is the workers' dial addresses as of a version of what the
// catalog serves (Catalog.EndpointsVersion): most catalog writes leave
// them, and a list made again on each cost every request under churn.
// Requests read the list without a lock; mu lets one of them make a new
// one while the others wait for it.
type dialCache struct {
	mu      sync.Mutex
	current atomic.Pointer[dialList]
}

// dialList is the dial addresses as of one version; never changed once
// published.
type dialList struct {
	version uint64
	dials   []string
}

// CaddyModule returns the Caddy module information.
func (Upstreams) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.upstreams.kv_router",
		New: func() caddy.Module { return new(Upstreams) },
	}
}

// Provision binds the source to the kv_router app's router.
func (u *Upstreams) Provision(ctx caddy.Context) error {
	app, err := kvApp(ctx)
	if err != nil {
		return err
	}
	u.router = app.Router()
	u.cache = new(dialCache)
	return nil
}

// GetUpstreams returns fresh upstreams for the catalog's schedulable
// workers, from a list made again only when they change.
func (u *Upstreams) GetUpstreams(*http.Request) ([]*reverseproxy.Upstream, error) {
	dials := u.cache.dials(u.router.Catalog())
	out := make([]*reverseproxy.Upstream, len(dials))
	for i, d := range dials {
		out[i] = &reverseproxy.Upstream{Dial: d}
	}
	return out, nil
}

// dials is the list as of c's current version, made when it is older.
func (d *dialCache) dials(c *selection.Catalog) []string {
	// The version is read before the endpoints: a list made of endpoints
	// newer than its version is made again, never the reverse.
	v := c.EndpointsVersion()
	if l := d.current.Load(); l != nil && l.version == v {
		return l.dials
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if l := d.current.Load(); l != nil && l.version == v {
		return l.dials // made while this request waited
	}
	seen := map[string]bool{}
	var dials []string
	for _, ep := range c.SchedulableEndpoints(nil) {
		if d := selection.HostPort(ep); !seen[d] {
			seen[d] = true
			dials = append(dials, d)
		}
	}
	d.current.Store(&dialList{version: v, dials: dials})
	return dials
}

// UnmarshalCaddyfile sets up the source from Caddyfile tokens. Syntax:
//
//	dynamic kv_router
func (u *Upstreams) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume source name
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(0) {
		return d.Errf("unrecognized subdirective %s", d.Val())
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Upstreams)(nil)
	_ reverseproxy.UpstreamSource = (*Upstreams)(nil)
	_ caddyfile.Unmarshaler       = (*Upstreams)(nil)
)
