package caddymodule

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
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
	// (the handler did not run: not a POST with a body, or another route).
	// A request the handler saw but could not route is answered by it
	// (404 or 503), never by the fallback.
	// Default: least_conn.
	FallbackRaw json.RawMessage `json:"fallback,omitempty" caddy:"namespace=http.reverse_proxy.selection_policies inline_key=policy"`

	// ResponseHeaderTimeout is how long reverse_proxy waits for a worker's
	// response headers before answering 504, given to its http transport
	// when the transport sets none (Caddy's default is to wait forever, so
	// a worker that hangs before answering holds its clients forever).
	// A streamed completion's headers come as soon as the worker accepts
	// the request, but a non-streamed one's come only after the whole
	// generation, so the bound must cover a long prompt's prefill plus a
	// long answer: the default is 10 minutes, the OpenAI Python client's own
	// default timeout, past which its caller has given up anyway. A
	// response_header_timeout in the reverse_proxy's transport http block
	// takes precedence. Zero leaves the transport as it is.
	// Default: 10m.
	ResponseHeaderTimeout *caddy.Duration `json:"response_header_timeout,omitempty"`

	fallback reverseproxy.Selector
}

// DefaultResponseHeaderTimeout is ResponseHeaderTimeout's default.
const DefaultResponseHeaderTimeout = 10 * time.Minute

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
	timeout := DefaultResponseHeaderTimeout
	if p.ResponseHeaderTimeout != nil {
		timeout = time.Duration(*p.ResponseHeaderTimeout)
	}
	if timeout < 0 {
		return errors.New("response_header_timeout must not be negative")
	}
	if timeout > 0 {
		return boundResponseHeaders(ctx, timeout)
	}
	return nil
}

// boundResponseHeaders gives the reverse_proxy that loads this policy a
// response-header timeout when its transport has none. reverse_proxy
// provisions its transport before its selection policy and creates its
// default transport only after, so the policy sees either the configured
// transport (and fills in its unset timeout) or none (and provides the
// default transport with the timeout set). Either way, it runs before the
// handler serves anything.
func boundResponseHeaders(ctx caddy.Context, timeout time.Duration) error {
	var proxy *reverseproxy.Handler
	for _, m := range ctx.Modules() {
		if h, ok := m.(*reverseproxy.Handler); ok {
			proxy = h
		}
	}
	if proxy == nil {
		return nil // not under a reverse_proxy (loaded on its own, in a test)
	}
	switch t := proxy.Transport.(type) {
	case nil:
		ht := &reverseproxy.HTTPTransport{ResponseHeaderTimeout: caddy.Duration(timeout)}
		if err := ht.Provision(ctx); err != nil {
			return fmt.Errorf("provisioning the http transport: %v", err)
		}
		proxy.Transport = ht
	case *reverseproxy.HTTPTransport:
		if t.ResponseHeaderTimeout == 0 && t.Transport != nil {
			t.ResponseHeaderTimeout = caddy.Duration(timeout)
			t.Transport.ResponseHeaderTimeout = timeout
		}
	}
	return nil
}

// Select returns the reserved worker's upstream, failing over as needed.
func (p *Policy) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	d := decisionFrom(r)
	if d == nil {
		return p.fallback.Select(pool, r, w)
	}
	// A second call for the same request means the previous attempt failed
	// (reverse_proxy retries only then): that worker is done for.
	if d.retrying() && !d.failover() {
		return nil
	}
	for range len(pool) + 1 {
		target := d.res.Target()
		if target == "" {
			return nil
		}
		for _, u := range pool {
			// Dial addresses are host:port, as Target is: Caddy parses a
			// "to" URL into one, and dynamic kv_router makes them with
			// selection.HostPort from the same endpoints.
			if u.Dial == target && u.Available() {
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
//		response_header_timeout <duration>
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
		case "response_header_timeout":
			dur, err := parseDuration(d)
			if err != nil {
				return err
			}
			p.ResponseHeaderTimeout = &dur
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
