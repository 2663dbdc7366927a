package caddymodule

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestApproxIndexBoundedByIndexMaxMemory: without KV events every booked
// prompt is recorded in the approximate index for approx_ttl, so a client
// sending unique prompts decides how much it holds. Through the built
// gateway, with index_max_memory at its floor (16 MiB, a third of it for
// the index's live heap), 800 bookings of unique 4,096-token prompts
// (about 13 MB of records) leave the index within its bound, the oldest
// evicted and counted, and the newest still matched.
func TestApproxIndexBoundedByIndexMaxMemory(t *testing.T) {
	tester := newTester(t)
	tester.InitServer(approxCaddyfile(worker1+"\n\t\tindex_max_memory 16MiB\n\t\tapprox_ttl 1h", "\thandle {\n\t\tkv_selection\n\t}"), "caddyfile")
	const prompts, tokens = 800, 4096
	prompt := func(i int) string {
		var b strings.Builder
		b.WriteString(`{"model_name":"m","token_ids":[`)
		for j := range tokens {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(i*tokens + j + 1))
		}
		b.WriteString(`]}`)
		return b.String()
	}
	for i := range prompts {
		var sel struct {
			SelectionID string `json:"selection_id"`
		}
		callJSON(t, tester, http.MethodPost, "/select_and_reserve", prompt(i), http.StatusOK, &sel)
		callJSON(t, tester, http.MethodDelete, "/reservations/"+sel.SelectionID, "", http.StatusOK, nil)
	}
	metrics := adminGet(t, tester, "/metrics")
	value := func(name string) float64 {
		m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindStringSubmatch(metrics)
		if m == nil {
			t.Fatalf("no %s in the metrics:\n%s", name, grepLines(metrics, "kvrouter_approx"))
		}
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	bytes, evicted := value("kvrouter_approx_index_bytes"), value("kvrouter_approx_index_evicted_total")
	t.Logf("approximate index: %.0f bytes, %.0f holds evicted", bytes, evicted)
	if bound := float64(16<<20) / 3; bytes > bound || bytes < bound/2 || evicted == 0 {
		t.Fatalf("index %.0f bytes (bound %.0f), %.0f evicted: want it filled to within its bound, with evictions", bytes, bound, evicted)
	}
	var sel struct {
		Overlap struct {
			GPU uint32 `json:"gpu"`
		} `json:"overlap"`
	}
	callJSON(t, tester, http.MethodPost, "/select", prompt(prompts-1), http.StatusOK, &sel)
	if sel.Overlap.GPU != tokens { // overlap counts tokens
		t.Fatalf("the newest prompt matched %d tokens, want %d", sel.Overlap.GPU, tokens)
	}
	callJSON(t, tester, http.MethodPost, "/select", prompt(0), http.StatusOK, &sel)
	if sel.Overlap.GPU != 0 {
		t.Fatalf("the oldest prompt still matched %d tokens", sel.Overlap.GPU)
	}
}
