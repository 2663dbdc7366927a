package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/kvrouter/caddy-kvrouter/selection"
)

func init() {
	caddy.RegisterModule(Policy{})
}

// Policy is lb_policy kv_router: it sends the request to the worker the
// kv_router handler reserved for it. When that worker is not among the
// upstreams, is unavailable (health checks, circuit breaker, max_requests)
// or failed to answer a previous attempt, the reservation moves to the
// next-best worker not tried yet, so lb_retries gives real failover.
// Requests the handler did not route go to the fallback policy.
//
// Upstreams are matched to catalog workers by address: the worker's
// endpoint, without a scheme, must equal the upstream's dial address. With
// dynamic kv_router they always do.
type Policy struct {
	// FallbackRaw is the policy for requests without a kv_router decision
	// (the handler did not run, or no worker could be reserved).
	// Default: least_conn.
	FallbackRaw json.RawMessage `json:"fallback,omitempty" caddy:"namespace=http.reverse_proxy.selection_policies inline_key=policy"`

	fallback reverseproxy.Selector
}

// CaddyModule returns the Caddy module information.
func (Policy) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.kv_router",
		New: func() caddy.Module { return new(Policy) },
	}
}

// Provision loads the fallback policy.
func (p *Policy) Provision(ctx caddy.Context) error {
	if p.FallbackRaw == nil {
		p.FallbackRaw = caddyconfig.JSONModuleObject(reverseproxy.LeastConnSelection{}, "policy", "least_conn", nil)
	}
	mod, err := ctx.LoadModule(p, "FallbackRaw")
	if err != nil {
		return fmt.Errorf("loading fallback selection policy: %v", err)
	}
	p.fallback = mod.(reverseproxy.Selector)
	return nil
}

// Select returns the reserved worker's upstream, failing over as needed.
func (p *Policy) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	d := decisionFrom(r)
	if d == nil {
		return p.fallback.Select(pool, r, w)
	}
	d.mu.Lock()
	d.attempts++
	retry := d.attempts > 1
	d.mu.Unlock()
	// A second call for the same request means the previous attempt failed
	// (reverse_proxy retries only then): that worker is done for.
	if retry && !d.failover() {
		return nil
	}
	for range len(pool) + 1 {
		ep, resp := d.target()
		if resp == nil {
			return nil
		}
		for _, u := range pool {
			if selection.HostPort(u.Dial) == ep && u.Available() {
				if w != nil {
					d.annotate(w, r)
				}
				return u
			}
		}
		if !d.failover() {
			return nil
		}
	}
	return nil
}

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens. Syntax:
//
//	lb_policy kv_router {
//		fallback <policy> [<args...>]
//	}
func (p *Policy) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume policy name
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "fallback":
			if !d.NextArg() {
				return d.ArgErr()
			}
			if p.FallbackRaw != nil {
				return d.Err("fallback selection policy already specified")
			}
			name := d.Val()
			mod, err := caddyfile.UnmarshalModule(d, "http.reverse_proxy.selection_policies."+name)
			if err != nil {
				return err
			}
			if _, ok := mod.(reverseproxy.Selector); !ok {
				return d.Errf("module %s is not a selection policy", name)
			}
			p.FallbackRaw = caddyconfig.JSONModuleObject(mod, "policy", name, nil)
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner     = (*Policy)(nil)
	_ reverseproxy.Selector = (*Policy)(nil)
	_ caddyfile.Unmarshaler = (*Policy)(nil)
)
