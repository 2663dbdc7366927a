package hostile

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/internal/proctest"
)

// gateway is one bin/caddy process and its three listeners.
type gateway struct {
	*proctest.Process
	pid   int
	ports ports
	admin string // http://127.0.0.1:<admin port>
	proxy string // the OpenAI routes
	api   string // the selection API
	token string // the catalog's write token
}

// startGateway starts bin/caddy with caddyfile on fresh ports and waits
// until its selection API and admin routes answer (proctest.StartCaddy,
// which retries when a port was taken in between). The process is stopped
// by owner's cleanup (owner also holds its temporary directory), and by
// the kernel if the test binary dies first. It reports errors rather than
// failing owner, which may be a parent test.
// With bind it binds a KV-event endpoint for publishers to dial
// (g.ports.events).
func startGateway(owner *testing.T, bind bool) (*gateway, error) {
	g := &gateway{token: randomToken()}
	urls := func(pp []int) {
		g.ports = ports{admin: pp[0], proxy: pp[1], api: pp[2], events: pp[3]}
		g.admin = fmt.Sprintf("http://127.0.0.1:%d", g.ports.admin)
		g.proxy = fmt.Sprintf("http://127.0.0.1:%d", g.ports.proxy)
		g.api = fmt.Sprintf("http://127.0.0.1:%d", g.ports.api)
	}
	p, _, err := proctest.StartCaddy(owner, 4,
		func(pp []int) string { urls(pp); return caddyfile(g.ports, bind) },
		[]string{"KVROUTER_WRITE_TOKEN=" + g.token},
		func([]int) bool { return g.ready() })
	if err != nil {
		return nil, err
	}
	g.Process, g.pid = p, p.Pid
	return g, nil
}

// ready reports whether the selection API and the admin routes answer.
func (g *gateway) ready() bool {
	for _, u := range []string{g.api + "/health", g.admin + "/kv_router/stats"} {
		resp, err := quick.Get(u)
		if err != nil {
			return false
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false
		}
	}
	return true
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
