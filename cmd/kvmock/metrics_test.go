package main

import (
	"strings"
	"testing"
)

func TestCacheConfigInfo(t *testing.T) {
	f := newTestFleet(t, func(c *Config) { c.Workers, c.DPRanks, c.BlockSize, c.KVBlocks = 1, 2, 32, 300 })
	_, body := get(t, f.url(1)+"/metrics")
	if !strings.Contains(body, "# TYPE vllm:cache_config_info gauge\n") {
		t.Fatalf("no cache_config_info family:\n%s", body)
	}
	var lines []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "vllm:cache_config_info{") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("want one series per engine, got %q", lines)
	}
	for i, l := range lines {
		for _, want := range []string{`block_size="32"`, `num_gpu_blocks="300"`, `enable_prefix_caching="True"`,
			`num_cpu_blocks="None"`, `cache_dtype="auto"`, `engine="` + string(rune('0'+i)) + `"`} {
			if !strings.Contains(l, want) {
				t.Errorf("series %q lacks %s", l, want)
			}
		}
		if !strings.HasSuffix(l, "} 1") || strings.Contains(l, "model_name") {
			t.Errorf("series %q: want value 1 and no model_name, as vLLM writes it", l)
		}
	}
}
