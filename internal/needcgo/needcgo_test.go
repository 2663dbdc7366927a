package needcgo_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The instruction a build with cgo off must print (needcgo.go).
const instruction = "caddy-kvrouter needs cgo and libzmq: set CGO_ENABLED=1 and install libzmq3-dev and pkg-config"

// goTool runs the go command at the module root with cgo off and returns
// its combined output and error.
func goTool(t *testing.T, args ...string) (string, error) {
	t.Helper()
	// go test puts its own GOROOT/bin first in the test's PATH.
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to run")
	}
	cmd := exec.Command(gobin, args...)
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Every package a builder may name, the module root (xcaddy's --with) and
// the packages that reach libzmq, depends on the guard.
func TestGuardIsImported(t *testing.T) {
	for _, pkg := range []string{".", "./caddymodule", "./indexer", "./cmd/caddy"} {
		out, err := goTool(t, "list", "-deps", pkg)
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		if !strings.Contains(out, "github.com/kvrouter/caddy-kvrouter/internal/needcgo\n") {
			t.Errorf("%s does not import internal/needcgo with cgo off", pkg)
		}
	}
}

// The indexer (the package that uses the ZMQ binding; its dependencies are
// few, so this is quick) fails to build without cgo and says why, beside
// the binding's own errors.
func TestIndexerWithoutCgo(t *testing.T) {
	out, err := goTool(t, "build", "-o", os.DevNull, "./indexer")
	checkRefused(t, out, err)
}

// The module root, as xcaddy builds it: the whole of Caddy is compiled
// without cgo the first time (a minute or more on two cores, cached after).
func TestRootWithoutCgo(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles Caddy without cgo; skipped with -short")
	}
	// One package at a time, so the build takes one core beside the other
	// packages' tests.
	out, err := goTool(t, "build", "-p", "1", "-o", os.DevNull, ".")
	checkRefused(t, out, err)
}

func checkRefused(t *testing.T, out string, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("the build with CGO_ENABLED=0 succeeded:\n%s", out)
	}
	if !strings.Contains(out, instruction) {
		t.Fatalf("the build with CGO_ENABLED=0 failed without saying %q:\n%s", instruction, out)
	}
}
