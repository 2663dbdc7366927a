package caddymodule

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestProxiedBodySkipsSelectionMembers: a completions body may carry the
// selection API's prompt members (block_hashes, sequence_hashes,
// block_mm_infos, mm_routing_info), which the proxy does not read. They
// are skipped, not decoded: a body of about 1 MiB of one of them
// allocates a few times its size at most (copies of the members goccy
// reads, unknown ones among them), where decoded they cost 22-27 times it
// (a 15 MB block_hashes held some 260 MB while its request lasted).
func TestProxiedBodySkipsSelectionMembers(t *testing.T) {
	if raceDetector {
		// Each decode takes long enough under it that an earlier test's
		// servers, winding down, allocated 5-6 times the body meanwhile,
		// in all of five tries; the plain run checks the bound.
		t.Skip("allocations are measured process-wide; the race build is too slow to measure them apart")
	}
	const n = 1 << 19 // elements of about two bytes each
	zeros := "[" + string(bytes.Repeat([]byte("0,"), n)) + "0]"
	empties := "[" + string(bytes.Repeat([]byte("{},"), n)) + "{}]"
	for _, member := range []string{
		`"block_hashes":` + zeros,
		`"sequence_hashes":` + zeros,
		`"block_mm_infos":` + empties,
		`"mm_routing_info":{"block_mm_infos":` + empties + `}`,
	} {
		body := []byte(`{"model":"m","prompt":[1,2,3],"lora_name":"l","cache_salt":"s",` + member + `}`)
		var o openAIRequest
		// Once to warm the decoder's pooled buffers (a copy of the body's
		// members goccy reads, which an unknown member is among), then
		// measured.
		if err := selection.DecodeJSON(body, &o); err != nil {
			t.Fatal(err)
		}
		// TotalAlloc is the process's: what other goroutines allocate
		// meanwhile (an earlier test's servers winding down) counts too,
		// so the least of five decodes is taken (one CI run read 4.8x).
		least := uint64(1<<64 - 1)
		for range 5 {
			o = openAIRequest{}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			if err := selection.DecodeJSON(body, &o); err != nil {
				t.Fatal(err)
			}
			runtime.ReadMemStats(&after)
			least = min(least, after.TotalAlloc-before.TotalAlloc)
		}
		if len(o.promptTokens) != 3 || o.LoraName != "l" || o.CacheSalt != "s" {
			t.Fatalf("%.20s: prompt %v lora %q salt %q", member, o.promptTokens, o.LoraName, o.CacheSalt)
		}
		if least > 4*uint64(len(body)) {
			t.Errorf("%.20s...: decoding a %d-byte body allocated %d bytes", member, len(body), least)
		}
	}
}
