package caddymodule

import (
	"fmt"
	"io"
	"regexp"
	"strconv"
	"testing"
)

// TestSelectTimingMetrics: a request routed through a real Caddy is
// counted in the selection's lock-wait, lock-held and work histograms.
func TestSelectTimingMetrics(t *testing.T) {
	tester := newTester(t)
	w1 := newTestWorker(t, 1)
	tester.InitServer(proxyCaddyfile(workerBlock(w1)), "caddyfile")
	w1.waitSubscribed()
	count := func(name string) int {
		t.Helper()
		res, err := tester.Client.Get(fmt.Sprintf("http://localhost:%d/metrics", testAdminPort))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		m := regexp.MustCompile(`(?m)^` + name + `_count (\d+)$`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("metrics lack %s_count", name)
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n
	}
	names := []string{"kvrouter_selection_lock_wait_seconds", "kvrouter_selection_lock_held_seconds", "kvrouter_selection_work_seconds"}
	before := map[string]int{}
	for _, n := range names {
		before[n] = count(n)
	}
	const requests = 3
	for range requests {
		if res, _ := post(t, tester, "/v1/completions", `{"model":"m","prompt":`+tokensJSON(seqTokens(1, 40))+`}`); res.StatusCode != 200 {
			t.Fatalf("status %d", res.StatusCode)
		}
	}
	waitNoReservations(t)
	for _, n := range names {
		if got := count(n) - before[n]; got != requests {
			t.Errorf("%s counted %d selections, want %d", n, got, requests)
		}
	}
}
