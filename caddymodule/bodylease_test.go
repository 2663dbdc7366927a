package caddymodule

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestBodyLeaseCountsReaders: every reader of a pooled body the proxy can
// be handed (the restored body, one from GetBody, the body with the usage
// option added and its GetBody) keeps the buffer from the pool until it
// is closed, as a transport that writes the body after the worker
// answered would; closing one twice counts once, and the body the usage
// option replaced, never to be read, does not hold it.
func TestBodyLeaseCountsReaders(t *testing.T) {
	const body = `{"model":"m","stream":true,"prompt":"hello"}`
	r := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
	lease := new(bodyLease)
	got, _, err := readAndRestore(r, 1<<20, nil, lease)
	if err != nil || string(got) != body {
		t.Fatalf("restored %q, %v", got, err)
	}
	if lease.idle() {
		t.Fatal("idle with the restored body open")
	}
	again, _ := r.GetBody()
	_ = r.Body.Close()
	_ = r.Body.Close()
	if lease.idle() {
		t.Fatal("idle with GetBody's reader open")
	}
	if b, _ := io.ReadAll(again); string(b) != body {
		t.Fatalf("GetBody read %q", b)
	}
	_ = again.Close()
	if !lease.idle() {
		t.Fatal("not idle with every reader closed")
	}

	r = httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
	lease = new(bodyLease)
	got, _, _ = readAndRestore(r, 1<<20, nil, lease)
	if !addUsageOption(r, got, lease) {
		t.Fatal("no usage option added")
	}
	if lease.idle() {
		t.Fatal("idle with the body with the usage option open")
	}
	more, _ := r.GetBody()
	_ = r.Body.Close()
	if lease.idle() {
		t.Fatal("idle with its GetBody reader open")
	}
	_ = more.Close()
	if !lease.idle() {
		t.Fatal("not idle with every reader closed (the replaced body held it)")
	}
}
