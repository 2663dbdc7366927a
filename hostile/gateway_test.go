package hostile

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// gateway is one bin/caddy process and its three listeners.
type gateway struct {
	cmd     *exec.Cmd
	pid     int
	ports   ports
	admin   string // http://127.0.0.1:<admin port>
	proxy   string // the OpenAI routes
	api     string // the selection API
	token   string // the catalog's write token
	logPath string // its stdout and stderr

	exited   chan struct{}
	exitErr  error
	stopOnce sync.Once
}

// errBindClash is a gateway that could not bind a port freePorts chose:
// another process took it in between.
var errBindClash = errors.New("a listener port was taken")

// startGateway starts bin/caddy with caddyfile on fresh ports and waits
// until its selection API and admin routes answer. It retries on a bind
// clash. The process is stopped by owner's cleanup (owner also holds its
// temporary directory), and by the kernel if the test binary dies first.
// It reports errors rather than failing owner, which may be a parent test.
func startGateway(owner *testing.T) (*gateway, error) {
	bin, err := gatewayBinary()
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
	pp, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	g := &gateway{ports: ports{admin: pp[0], proxy: pp[1], api: pp[2]}, exited: make(chan struct{})}
	g.admin = fmt.Sprintf("http://127.0.0.1:%d", g.ports.admin)
	g.proxy = fmt.Sprintf("http://127.0.0.1:%d", g.ports.proxy)
	g.api = fmt.Sprintf("http://127.0.0.1:%d", g.ports.api)
	g.token = randomToken()

	dir := t.TempDir()
	conf := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(conf, []byte(caddyfile(g.ports)), 0o600); err != nil {
		return nil, err
	}
	g.logPath = filepath.Join(dir, "caddy.log")
	logf, err := os.Create(g.logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	g.cmd = exec.Command(bin, "run", "--config", conf, "--adapter", "caddyfile")
	// Caddy's data and config directories go to the test's temporary
	// directory, not the user's home.
	g.cmd.Env = append(os.Environ(), "KVROUTER_WRITE_TOKEN="+g.token, "HOME="+dir,
		"XDG_DATA_HOME="+filepath.Join(dir, "data"), "XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
	g.cmd.Stdout, g.cmd.Stderr = logf, logf
	// If the test binary is killed (a -timeout panic), take the gateway
	// with it rather than leave it holding ports and memory.
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := g.cmd.Start(); err != nil {
		return nil, err
	}
	g.pid = g.cmd.Process.Pid
	go func() {
		g.exitErr = g.cmd.Wait()
		close(g.exited)
	}()
	t.Cleanup(g.stop)

	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-g.exited:
			log := g.logTail(30)
			if strings.Contains(log, "address already in use") {
				return nil, errBindClash
			}
			return nil, fmt.Errorf("the gateway exited at start (%v):\n%s", g.exitErr, log)
		case <-time.After(50 * time.Millisecond):
		}
		if g.ready() {
			return g, nil
		}
		if time.Now().After(deadline) {
			g.stop()
			return nil, fmt.Errorf("the gateway did not answer within 30s:\n%s", g.logTail(30))
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

// alive reports whether the process is still running.
func (g *gateway) alive() bool {
	select {
	case <-g.exited:
		return false
	default:
		return true
	}
}

// stop ends the process: SIGTERM, then SIGKILL if it has not exited within
// 5 s (a gateway wedged by an attack must not outlive the test).
func (g *gateway) stop() {
	g.stopOnce.Do(func() {
		if !g.alive() {
			return
		}
		_ = g.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-g.exited:
		case <-time.After(5 * time.Second):
			_ = g.cmd.Process.Kill()
			<-g.exited
		}
	})
}

// logTail returns the last n lines the process wrote.
func (g *gateway) logTail(n int) string {
	b, err := os.ReadFile(g.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// exitReason says how the process ended, with the Go runtime's own words
// when it died of a fatal error or a panic (the first such line of its
// output; the goroutine dump after it is noise here).
func (g *gateway) exitReason() string {
	if g.alive() {
		return ""
	}
	if b, err := os.ReadFile(g.logPath); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "fatal error:") || strings.HasPrefix(l, "panic:") {
				return fmt.Sprintf("%v, %s", g.exitErr, l)
			}
		}
	}
	return fmt.Sprint(g.exitErr)
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
