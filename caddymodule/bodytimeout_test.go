package caddymodule

import (
	"bufio"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// TestBodyTimeout: a client that sends its body a byte now and then is
// answered 408 once body_timeout has passed, and its connection closed; a
// body that arrives in time is read whole.
func TestBodyTimeout(t *testing.T) {
	h := &Handler{MaxBodySize: 1 << 20, BodyTimeout: caddy.Duration(200 * time.Millisecond)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, status, err := h.readBody(w, r, nil, new(bodyLease))
		if err != nil {
			http.Error(w, err.Error(), status)
			return
		}
		_, _ = w.Write(body)
	}))
	defer srv.Close()

	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusRequestTimeout || !res.Close {
		t.Errorf("a stalled body: %d, close %v; want 408 and the connection closed", res.StatusCode, res.Close)
	}

	res, err = http.Post(srv.URL, "application/json", strings.NewReader(`{"prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("a body in time: %d", res.StatusCode)
	}
}
