package caddymodule

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// A worker endpoint that points at the gateway itself turns the proxy
// against its host: requests routed there loop back into Caddy, and one
// that reaches Caddy's admin listener (with a Host header the client
// chose, which reverse_proxy passes on) can replace the whole config. So
// the catalog refuses such endpoints (selection.WithEndpointCheck → 422).
//
// The gateway's HTTP listeners are known from the running http app. Caddy
// does not expose its admin address to modules, so the admin listener is
// recognized by asking: the kv_router admin module serves a random
// per-process id at /kv_router/instance, and an endpoint that answers with
// it is this process's admin listener, whatever name or address it was
// reached by. Only endpoints that resolve to an address of this machine
// are checked (no probe is sent elsewhere). A name that does not resolve
// is accepted: the worker cannot be reached until it does, and a name
// someone can later point at the gateway is a DNS problem this check
// cannot solve.

// instancePath is the admin route that answers instanceID.
const instancePath = "/kv_router/instance"

// instanceID identifies this process to selfGuard's probe.
var instanceID = randomID()

// randomID is 16 random bytes in hex.
func randomID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// instanceAnswer is the body of GET /kv_router/instance.
type instanceAnswer struct {
	Instance string `json:"instance"`
}

// selfGuard checks worker endpoints against the gateway's own listeners.
type selfGuard struct {
	timeout time.Duration // per DNS lookup and per probe
	client  *http.Client
}

func newSelfGuard() *selfGuard {
	const timeout = 2 * time.Second
	return &selfGuard{timeout: timeout, client: &http.Client{
		Timeout:       timeout,
		Transport:     &http.Transport{DisableKeepAlives: true, Proxy: nil},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// check is the catalog's endpoint check: an error names why the endpoint
// is this gateway.
func (g *selfGuard) check(endpoint string) error {
	host, port, err := net.SplitHostPort(selection.HostPort(endpoint))
	if err != nil {
		return nil // no port: reverse_proxy cannot dial it, so it reaches nothing
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if !isLocalIP(a.IP) {
			continue
		}
		if l := ownHTTPListener(a.IP, port); l != "" {
			return fmt.Errorf("endpoint %s is this gateway's own listener %s", endpoint, l)
		}
		if g.isOwnAdmin(a.IP, port) {
			return fmt.Errorf("endpoint %s is this gateway's admin listener", endpoint)
		}
	}
	return nil
}

// isLocalIP reports whether ip reaches this machine.
func isLocalIP(ip net.IP) bool {
	if ip.IsLoopback() || ip.IsUnspecified() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

// ownHTTPListener returns the address of the running http app's listener
// that ip:port reaches, or "".
func ownHTTPListener(ip net.IP, port string) string {
	app, err := caddy.ActiveContext().AppIfConfigured("http")
	if err != nil {
		return ""
	}
	httpApp, ok := app.(*caddyhttp.App)
	if !ok {
		return ""
	}
	for _, srv := range httpApp.Servers {
		for _, l := range srv.Listeners() {
			lhost, lport, err := net.SplitHostPort(l.Addr().String())
			if err != nil || lport != port {
				continue
			}
			lip := net.ParseIP(lhost)
			// A wildcard listener takes every local address; a connection
			// to the unspecified address reaches any local listener.
			if lip == nil || lip.IsUnspecified() || ip.IsUnspecified() || lip.Equal(ip) {
				return l.Addr().String()
			}
		}
	}
	return ""
}

// isOwnAdmin asks ip:port for this process's instance id. The Host header
// is one Caddy's admin accepts for a listener on that address.
func (g *selfGuard) isOwnAdmin(ip net.IP, port string) bool {
	host := net.JoinHostPort(ip.String(), port)
	if ip.IsLoopback() || ip.IsUnspecified() {
		host = net.JoinHostPort("localhost", port)
	}
	req, err := http.NewRequest(http.MethodGet, "http://"+net.JoinHostPort(ip.String(), port)+instancePath, nil)
	if err != nil {
		return false
	}
	req.Host = host
	// Marked as every call the gateway makes: one that reaches its own
	// proxy comes back as a request and is refused at once.
	req.Header.Set(viaHeader, processID)
	res, err := g.client.Do(req)
	if err != nil {
		return false
	}
	defer res.Body.Close()
	var ans instanceAnswer
	if res.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(res.Body, 4<<10)).Decode(&ans) != nil {
		return false
	}
	return ans.Instance == instanceID
}
