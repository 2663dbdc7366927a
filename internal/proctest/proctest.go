// Package proctest runs the project's binaries (bin/caddy, bin/kvmock) as
// separate processes for end-to-end tests: the gateway and a simulated
// fleet, as an operator runs them, with nothing shared but sockets.
//
// A binary is the one `make build` left in bin/; a checkout without it
// (plain `go test ./...`) builds it once into a temporary directory, so a
// test never skips for want of it. Every process is started with its own
// log file, dies with the test binary (Pdeathsig), and is stopped by the
// test's cleanup.
package proctest

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// builds remembers the binaries built in this test process.
var builds struct {
	mu   sync.Mutex
	path map[string]string
	dirs []string
}

// RepoRoot is the module's root, found upward from the working directory
// (a test runs in its package's directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Binary returns bin/<name>, building ./cmd/<name> once into a temporary
// directory when bin/<name> is missing or older than a source file (a test
// of a stale binary would test code that is no longer there).
func Binary(name string) (string, error) {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if p, ok := builds.path[name]; ok {
		return p, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(root, "bin", name)
	if !newerThanSources(bin, root) {
		dir, err := os.MkdirTemp("", "proctest-"+name+"-")
		if err != nil {
			return "", err
		}
		builds.dirs = append(builds.dirs, dir)
		bin = filepath.Join(dir, name)
		cmd := exec.Command("go", "build", "-o", bin, "./cmd/"+name)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1") // pebbe/zmq4 needs cgo
		if msg, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("bin/%s is missing and building it failed: %v\n%s", name, err, msg)
		}
	}
	if builds.path == nil {
		builds.path = map[string]string{}
	}
	builds.path[name] = bin
	return bin, nil
}

// newerThanSources reports whether bin exists and is newer than every Go
// non-test source file and go.mod/go.sum of the module at root.
func newerThanSources(bin, root string) bool {
	info, err := os.Stat(bin)
	if err != nil {
		return false
	}
	built := info.ModTime()
	stale := errors.New("stale")
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (name == "bin" || strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		if !strings.HasSuffix(name, ".go") && name != "go.mod" && name != "go.sum" || strings.HasSuffix(name, "_test.go") {
			return nil // tests are not in the binaries
		}
		if fi, err := d.Info(); err == nil && fi.ModTime().After(built) {
			return stale
		}
		return nil
	})
	return err == nil
}

// RemoveBuilds removes the binaries Binary built; TestMain calls it after
// the tests.
func RemoveBuilds() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	for _, d := range builds.dirs {
		_ = os.RemoveAll(d)
	}
	builds.dirs, builds.path = nil, nil
}

// FreePorts returns n distinct TCP ports on 127.0.0.1 that were free a
// moment ago: all n are held open together (so they differ), then
// released for a process to bind. Another process can take one in
// between; callers retry with new ports when a bind fails.
func FreePorts(n int) ([]int, error) {
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Process is one started binary.
type Process struct {
	Cmd     *exec.Cmd
	Pid     int
	LogPath string // its stdout and stderr

	exited   chan struct{}
	exitErr  error
	stopOnce sync.Once
}

// Start runs bin with args and extra environment variables (appended to
// the test's), its output in a log file under dir. The process is stopped
// by t's cleanup, and by the kernel if the test binary dies first.
func Start(t testing.TB, dir, bin string, args, env []string) (*Process, error) {
	p := &Process{exited: make(chan struct{}), LogPath: filepath.Join(dir, filepath.Base(bin)+".log")}
	logf, err := os.Create(p.LogPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	p.Cmd = exec.Command(bin, args...)
	p.Cmd.Env = append(os.Environ(), env...)
	p.Cmd.Stdout, p.Cmd.Stderr = logf, logf
	// If the test binary is killed (a -timeout panic), take the process
	// with it rather than leave it holding ports and memory.
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.Cmd.Start(); err != nil {
		return nil, err
	}
	p.Pid = p.Cmd.Process.Pid
	go func() {
		p.exitErr = p.Cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(p.Stop)
	return p, nil
}

// Exited is closed when the process has ended.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitErr is what Wait returned, once Exited is closed.
func (p *Process) ExitErr() error { return p.exitErr }

// Alive reports whether the process is still running.
func (p *Process) Alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Stop ends the process: SIGTERM, then SIGKILL if it has not exited within
// 5 s (a process wedged by a test must not outlive it).
func (p *Process) Stop() {
	p.stopOnce.Do(func() {
		if !p.Alive() {
			return
		}
		_ = p.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(5 * time.Second):
			_ = p.Cmd.Process.Kill()
			<-p.exited
		}
	})
}

// Log returns everything the process wrote.
func (p *Process) Log() string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// LogTail returns the last n lines the process wrote.
func (p *Process) LogTail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ExitReason says how the process ended, with the Go runtime's own words
// when it died of a fatal error or a panic (the first such line of its
// output; the goroutine dump after it is noise here).
func (p *Process) ExitReason() string {
	if p.Alive() {
		return ""
	}
	for _, l := range strings.Split(p.Log(), "\n") {
		if strings.HasPrefix(l, "fatal error:") || strings.HasPrefix(l, "panic:") {
			return fmt.Sprintf("%v, %s", p.exitErr, l)
		}
	}
	return fmt.Sprint(p.exitErr)
}

// ErrPortTaken is a Caddy that could not bind a port FreePorts chose:
// another process took it in between.
var ErrPortTaken = errors.New("a listener port was taken")

// StartCaddy starts bin/caddy with the Caddyfile caddyfile(ports) on n
// fresh loopback ports, with env added to the environment, and waits up to
// 30 s until ready(ports) is true. Caddy's data and config directories go
// to a temporary directory of t's, not the user's home. When a port was
// taken in between it starts again on new ports, up to four times. The
// process is stopped by t's cleanup.
func StartCaddy(t testing.TB, n int, caddyfile func(ports []int) string, env []string, ready func(ports []int) bool) (*Process, []int, error) {
	bin, err := Binary("caddy")
	if err != nil {
		return nil, nil, err
	}
	for attempt := 1; ; attempt++ {
		p, ports, err := tryCaddy(t, bin, n, caddyfile, env, ready)
		if err == nil || !errors.Is(err, ErrPortTaken) || attempt == 4 {
			return p, ports, err
		}
	}
}

func tryCaddy(t testing.TB, bin string, n int, caddyfile func([]int) string, env []string, ready func([]int) bool) (*Process, []int, error) {
	ports, err := FreePorts(n)
	if err != nil {
		return nil, nil, err
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(conf, []byte(caddyfile(ports)), 0o600); err != nil {
		return nil, nil, err
	}
	env = append(slices.Clone(env), "HOME="+dir,
		"XDG_DATA_HOME="+filepath.Join(dir, "data"), "XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
	p, err := Start(t, dir, bin, []string{"run", "--config", conf, "--adapter", "caddyfile"}, env)
	if err != nil {
		return nil, nil, err
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		select {
		case <-p.Exited():
			log := p.LogTail(30)
			if strings.Contains(log, "address already in use") {
				return nil, nil, ErrPortTaken
			}
			return nil, nil, fmt.Errorf("caddy exited at start (%v):\n%s", p.ExitErr(), log)
		case <-time.After(50 * time.Millisecond):
		}
		if ready(ports) {
			return p, ports, nil
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, nil, fmt.Errorf("caddy did not answer within 30s:\n%s", p.LogTail(30))
		}
	}
}
