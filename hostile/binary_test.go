package hostile

import (
	"os"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/internal/proctest"
)

// The gateway under attack is the real binary, bin/caddy, as `make build`
// leaves it. A checkout without it (plain `go test ./...` in CI) builds it
// instead of skipping: an attack that never runs proves nothing.

// gatewayPath names the binary under attack, for the table's heading.
func gatewayPath() string {
	p, err := proctest.Binary("caddy")
	if err != nil {
		return err.Error()
	}
	return p
}

func TestMain(m *testing.M) {
	code := m.Run()
	proctest.RemoveBuilds()
	os.Exit(code)
}
