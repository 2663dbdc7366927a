package caddymodule

import (
	"bufio"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// TestUsageCountsWhenTheClientLeavesAfterDone: a client that stops
// reading at [DONE] and hangs up while the worker still holds the stream
// open makes reverse_proxy abort (panic(http.ErrAbortHandler)); the
// usage had come, and is counted. Counted only on a normal return, a
// third of a benchmark's answers went uncounted (32 of 128).
func TestUsageCountsWhenTheClientLeavesAfterDone(t *testing.T) {
	tester := newTester(t)
	w1 := startTestWorker(t, 1, func(w *testWorker) {
		w.hold = func(rw http.ResponseWriter, r *http.Request) bool {
			rw.Header().Set("Content-Type", "text/event-stream")
			rw.WriteHeader(http.StatusOK)
			// vLLM's last chunks with stream_options.include_usage.
			fmt.Fprint(rw, "data: {\"id\":\"cmpl-1\",\"choices\":[{\"index\":0,\"text\":\"hi\"}]}\n\n")
			fmt.Fprint(rw, "data: {\"id\":\"cmpl-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"total_tokens\":41,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n")
			fmt.Fprint(rw, "data: [DONE]\n\n")
			rw.(http.Flusher).Flush()
			// The stream's end is still on its way when the client leaves.
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
			return true
		}
	})
	tester.InitServer(proxyCaddyfile(workerBlock(w1)), "caddyfile")
	w1.waitSubscribed()
	read := usageReportsTotal.WithLabelValues("m", "read")
	before := metricValue(read)
	body := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"prompt":` + tokensJSON(seqTokens(1, 40)) + `}`
	res := openCompletion(t, tester, body)
	lines := bufio.NewScanner(res.Body)
	for lines.Scan() && lines.Text() != "data: [DONE]" {
	}
	res.Body.Close() // before the end of the stream: the connection goes
	waitNoReservations(t)
	deadline := time.Now().Add(5 * time.Second)
	for metricValue(read) == before {
		if time.Now().After(deadline) {
			t.Fatal("the usage read before the client left was not counted")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
