package hostile

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// errBindClash is a gateway that could not bind a port proctest.FreePorts chose:
// another process took it in between.
var errBindClash = errors.New("a listener port was taken")

// startGateway starts bin/caddy with caddyfile on fresh ports and waits
// until its selection API and admin routes answer. It retries on a bind
// clash. The process is stopped by owner's cleanup (owner also holds its
// temporary directory), and by the kernel if the test binary dies first.
// It reports errors rather than failing owner, which may be a parent test.
func startGateway(owner *testing.T) (*gateway, error) {
	bin, err := proctest.Binary("caddy")
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		g, err := tryStart(owner, bin)
		if err == nil {
			return g, nil
		}
		if !errors.Is(err, errBindClash) || attempt == 4 {
			return nil, err
		}
	}
}

func tryStart(t *testing.T, bin string) (*gateway, error) {
	pp, err := proctest.FreePorts(3)
	if err != nil {
		return nil, err
	}
	g := &gateway{ports: ports{admin: pp[0], proxy: pp[1], api: pp[2]}}
	g.admin = fmt.Sprintf("http://127.0.0.1:%d", g.ports.admin)
	g.proxy = fmt.Sprintf("http://127.0.0.1:%d", g.ports.proxy)
	g.api = fmt.Sprintf("http://127.0.0.1:%d", g.ports.api)
	g.token = randomToken()

	dir := t.TempDir()
	conf := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(conf, []byte(caddyfile(g.ports)), 0o600); err != nil {
		return nil, err
	}
	// Caddy's data and config directories go to the test's temporary
	// directory, not the user's home.
	g.Process, err = proctest.Start(t, dir, bin, []string{"run", "--config", conf, "--adapter", "caddyfile"},
		[]string{"KVROUTER_WRITE_TOKEN=" + g.token, "HOME=" + dir,
			"XDG_DATA_HOME=" + filepath.Join(dir, "data"), "XDG_CONFIG_HOME=" + filepath.Join(dir, "config")})
	if err != nil {
		return nil, err
	}
	g.pid = g.Pid

	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-g.Exited():
			log := g.LogTail(30)
			if strings.Contains(log, "address already in use") {
				return nil, errBindClash
			}
			return nil, fmt.Errorf("the gateway exited at start (%v):\n%s", g.ExitErr(), log)
		case <-time.After(50 * time.Millisecond):
		}
		if g.ready() {
			return g, nil
		}
		if time.Now().After(deadline) {
			g.Stop()
			return nil, fmt.Errorf("the gateway did not answer within 30s:\n%s", g.LogTail(30))
		}
	}
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
