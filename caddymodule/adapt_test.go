package caddymodule

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile" // the caddyfile adapter
)

// adapt runs the Caddyfile adapter and fails on errors or warnings.
func adapt(t *testing.T, filename string, body []byte) map[string]any {
	t.Helper()
	adapter := caddyconfig.GetAdapter("caddyfile")
	if adapter == nil {
		t.Fatal("caddyfile adapter not registered")
	}
	out, warnings, err := adapter.Adapt(body, map[string]any{"filename": filename})
	if err != nil {
		t.Fatalf("adapting %s: %v", filename, err)
	}
	for _, w := range warnings {
		t.Errorf("adapting %s: warning: %s", filename, w.String())
	}
	var cfg map[string]any
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestCaddyfileExampleAdapts(t *testing.T) {
	const file = "../Caddyfile.example"
	body, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	cfg := adapt(t, file, body)
	apps, _ := cfg["apps"].(map[string]any)
	app, ok := apps["kv_router"].(map[string]any)
	if !ok {
		t.Fatalf("no kv_router app in %v", apps)
	}
	if app["block_size"] != 16.0 || app["use_kv_events"] != nil {
		t.Errorf("kv_router app = %v, want block_size 16 and use_kv_events at its default (on)", app)
	}
	out, _ := json.Marshal(cfg)
	for _, want := range []string{`"handler":"kv_selection"`, `"handler":"kv_router"`, `"policy":"kv_router"`, `"source":"kv_router"`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("no %s in %s", want, out)
		}
	}
	if k, p := strings.Index(string(out), `"handler":"kv_router"`), strings.Index(string(out), `"handler":"reverse_proxy"`); k < 0 || p < 0 || k > p {
		t.Errorf("kv_router is not ordered before reverse_proxy: %s", out)
	}

	// The app must also provision-check cleanly: the adapted JSON decodes
	// into App without unknown fields and passes validation.
	raw, _ := json.Marshal(app)
	var a App
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		t.Fatal(err)
	}
	if err := a.Validate(); err != nil {
		t.Errorf("example kv_router app does not validate: %v", err)
	}
}

// kv_selection runs before reverse_proxy without an order directive.
func TestSelectionDirectiveOrder(t *testing.T) {
	cfg := adapt(t, "Caddyfile", []byte(`:8092 {
	reverse_proxy 127.0.0.1:9000
	kv_selection /kv/*
}
`))
	out, _ := json.Marshal(cfg)
	s := string(out)
	sel, proxy := strings.Index(s, `"handler":"kv_selection"`), strings.Index(s, `"handler":"reverse_proxy"`)
	if sel < 0 || proxy < 0 || sel > proxy {
		t.Errorf("kv_selection is not ordered before reverse_proxy: %s", s)
	}
}
