package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// An open loop sends at its rate whatever the answers, and sorts them:
// streamed 2xx (with their TTFT), 429 (with their time) and the rest.
// It asserts lower bounds of times only: a loaded machine makes anything
// slower.
func TestOpenLoopSortsAnswers(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		switch n.Add(1) % 3 {
		case 0:
			time.Sleep(150 * time.Millisecond) // a slow refusal
			rw.Header().Set("Retry-After", "1")
			rw.WriteHeader(http.StatusTooManyRequests)
		case 1:
			rw.Header().Set("Content-Type", "text/event-stream")
			time.Sleep(20 * time.Millisecond)
			fmt.Fprint(rw, "data: {}\n\ndata: [DONE]\n\n")
		default:
			rw.WriteHeader(http.StatusBadGateway)
		}
	}))
	defer srv.Close()
	run := openLoop(srv.URL, "m", 200, 0, 300*time.Millisecond, 8, 1, 1, 5*time.Second)
	if run.Sent < 20 || run.Admitted+run.Shed+run.Errors != run.Sent {
		t.Fatalf("sent %d: admitted %d, shed %d, errors %d", run.Sent, run.Admitted, run.Shed, run.Errors)
	}
	if run.Admitted == 0 || run.Shed == 0 || run.Errors == 0 || run.FirstError != "status 502" {
		t.Fatalf("answers not sorted: %+v", run)
	}
	if run.TTFTP50 < 0.02 {
		t.Fatalf("TTFT p50 %.3f s, under the server's 20 ms", run.TTFTP50)
	}
	if run.ShedUnder != 0 || run.ShedP50 < 0.15 {
		t.Fatalf("429s after 150 ms: %.2f within 100 ms, p50 %.3f s", run.ShedUnder, run.ShedP50)
	}
	// A closed loop keeps its clients busy until the end.
	run = openLoop(srv.URL, "m", 0, 2, 200*time.Millisecond, 8, 1, 1, 5*time.Second)
	if run.Sent < 4 || run.OfferedRPS != 0 || run.Concurrency != 2 {
		t.Fatalf("closed loop: %+v", run)
	}
}
