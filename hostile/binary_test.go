package hostile

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// The gateway under attack is the real binary, bin/caddy, as `make build`
// leaves it. A checkout without it (plain `go test ./...` in CI) builds it
// here instead of skipping: an attack that never runs proves nothing.

var built struct {
	once sync.Once
	path string
	dir  string // a temporary build directory, removed by TestMain
	err  error
}

// repoRoot is the module's root; tests run in their package's directory.
func repoRoot() (string, error) {
	root, err := filepath.Abs("..")
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return "", fmt.Errorf("no go.mod above hostile/: %v", err)
	}
	return root, nil
}

// gatewayBinary returns bin/caddy, building the gateway once into a
// temporary directory when bin/caddy is missing.
func gatewayBinary() (string, error) {
	built.once.Do(func() {
		root, err := repoRoot()
		if err != nil {
			built.err = err
			return
		}
		bin := filepath.Join(root, "bin", "caddy")
		if _, err := os.Stat(bin); err == nil {
			built.path = bin
			return
		}
		if built.dir, built.err = os.MkdirTemp("", "hostile-caddy-"); built.err != nil {
			return
		}
		out := filepath.Join(built.dir, "caddy")
		cmd := exec.Command("go", "build", "-o", out, "./cmd/caddy")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1") // pebbe/zmq4 needs cgo
		if msg, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("bin/caddy is missing and building it failed: %v\n%s", err, msg)
			return
		}
		built.path = out
	})
	return built.path, built.err
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}
