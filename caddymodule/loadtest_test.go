package caddymodule

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Helpers shared by the tests that put traffic through the gateway from
// many goroutines: the reload tests and the cancel test.

// failures collects what a test's goroutines saw go wrong: every one is
// counted, the first 20 are kept for the report.
type failures struct {
	n    atomic.Int64
	mu   sync.Mutex
	msgs []string
}

func (f *failures) add(format string, args ...any) {
	f.n.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.msgs) < 20 {
		f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
	}
}

// kept returns the failures kept so far.
func (f *failures) kept() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.msgs...)
}

// report fails t with each kept failure.
func (f *failures) report(t *testing.T) {
	t.Helper()
	for _, m := range f.kept() {
		t.Error(m)
	}
}

// withUpstreamTransport adds a `transport http` block with lines to the
// reverse_proxy of proxyCaddyfile's configs.
func withUpstreamTransport(cfg string, lines ...string) string {
	block := "lb_retries 2\n\t\ttransport http {\n\t\t\t" + strings.Join(lines, "\n\t\t\t") + "\n\t\t}"
	return strings.Replace(cfg, "lb_retries 2", block, 1)
}

// freshConnClient opens a new connection for every request. Under reloads
// a keep-alive client would also meet the old server closing its idle
// connections, which says nothing about the gateway.
func freshConnClient() *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
}

// postRetryingResets posts a JSON completion body to the gateway, trying
// again (twice at most) only when the connection was reset or closed
// before any answer: Caddy's listener handoff can do that to a brand-new
// connection during a reload (a plain reverse_proxy does the same), and a
// client retries it as it would any reset. retried, when not nil, is told
// of each such reset. Nothing else is retried, so a test counting what the
// workers served sees a request the gateway accepted and then lost or sent
// twice.
func postRetryingResets(client *http.Client, body string, retried func(error)) (*http.Response, error) {
	for try := 0; ; try++ {
		res, err := client.Post(apiBase+"/v1/completions", "application/json", strings.NewReader(body))
		if err == nil || try == 2 || !resetBeforeAnswer(err) {
			return res, err
		}
		if retried != nil {
			retried(err)
		}
	}
}

// resetBeforeAnswer tells a connection the server reset or closed before
// sending any of the response: a reset, or EOF where the status line was
// due.
func resetBeforeAnswer(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
