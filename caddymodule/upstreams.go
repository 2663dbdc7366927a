package caddymodule

import (
	"net/http"
	"sync"

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

// dialCache is the workers' dial addresses as of a catalog version.
type dialCache struct {
	mu      sync.Mutex
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
	u.cache = &dialCache{version: ^uint64(0)}
	return nil
}

// GetUpstreams returns fresh upstreams for the catalog's schedulable
// workers, from a list rebuilt only when the catalog changes.
func (u *Upstreams) GetUpstreams(*http.Request) ([]*reverseproxy.Upstream, error) {
	c := u.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	if v := u.router.Catalog().Version(); v != c.version {
		seen := map[string]bool{}
		c.dials = c.dials[:0]
		for _, w := range u.router.Catalog().ListWorkers("", "") {
			if !w.Schedulable() || w.Endpoint == nil {
				continue
			}
			if d := selection.HostPort(*w.Endpoint); !seen[d] {
				seen[d] = true
				c.dials = append(c.dials, d)
			}
		}
		c.version = v
	}
	out := make([]*reverseproxy.Upstream, len(c.dials))
	for i, d := range c.dials {
		out[i] = &reverseproxy.Upstream{Dial: d}
	}
	return out, nil
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
