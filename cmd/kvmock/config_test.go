package main

import (
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/indexer"
)

func TestValidate(t *testing.T) {
	ok := DefaultConfig()
	if err := ok.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	cases := []struct {
		change func(*Config)
		want   string
	}{
		{func(c *Config) { c.Workers = 0 }, "--workers"},
		{func(c *Config) { c.PrefillRate = 0 }, "--prefill-rate"},
		{func(c *Config) { c.MaxTokens = 0 }, "--max-tokens"},
		// The default bases are 100 apart: 1,024 workers need moved bases.
		{func(c *Config) { c.Workers = 1024 }, "--zmq-base-port (5557-6580) overlaps --replay-base-port"},
		{func(c *Config) { c.DPRanks = 60 }, "overlaps"},
		{func(c *Config) { c.Admin = "127.0.0.1:8003" }, "--http-base-port (8001-8008) overlaps --admin"},
		{func(c *Config) { c.HTTPBasePort = 65530 }, "out of range"},
		{func(c *Config) { c.Admin = "nonsense" }, "--admin"},
		{func(c *Config) { c.Admin = "0.0.0.0:9000" }, "loopback"},
	}
	for _, tc := range cases {
		c := DefaultConfig()
		tc.change(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error with %q", err, tc.want)
		}
	}
	// Zero bases mean free ports and never collide.
	c := DefaultConfig()
	c.Workers, c.HTTPBasePort, c.ZMQBasePort, c.ReplayBasePort, c.Admin = 1024, 0, 0, 0, ""
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"--workers", "3", "--event-encoding", "array", "--decode-ms", "2.5",
		"--prefill-rate", "1000", "--zmq-base-port", "7000", "--replay-base-port", "7100", "--admin", ""})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Workers != 3 || cfg.Encoding != indexer.EncodingArray || cfg.DecodeTime != 2500*time.Microsecond ||
		cfg.PrefillRate != 1000 || cfg.ZMQBasePort != 7000 || cfg.Admin != "" {
		t.Fatalf("%+v", cfg)
	}
	if _, err := parseFlags([]string{"--event-encoding", "json"}); err == nil {
		t.Fatal("bad encoding accepted")
	}
}

func TestFleetStartFailsCleanlyOnABusyPort(t *testing.T) {
	f := newTestFleet(t, nil)
	cfg := testConfig()
	cfg.Admin = f.AdminAddr() // taken
	if _, err := NewFleet(cfg); err == nil || !strings.Contains(err.Error(), "admin") {
		t.Fatalf("err %v", err)
	}
	// The failed fleet released its ports: the running one still works.
	complete(t, f, 1, tokenRange(1, 20), 1)
}
