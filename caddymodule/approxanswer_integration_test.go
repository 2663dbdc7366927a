package caddymodule

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestApproxModeRecordsAStreamOnceItsFirstByteCame: vLLM answers a stream
// with its 200 and headers before its engine takes the request (a
// streaming response starts at once), so a client that hangs up right
// after the headers has had nothing prefilled. In approximate mode the
// gateway recorded the prompt as cached on the 200 alone, and the same
// prompt sent again was promised all of it: any client could plant
// prefixes on a worker at no cost to the engine. The prompt is now
// recorded when the worker's first byte comes too.
func TestApproxModeRecordsAStreamOnceItsFirstByteCame(t *testing.T) {
	// A worker that, as vLLM does, sends a stream's headers at once; the
	// first request then waits for its client to leave, the others send
	// their first token.
	var calls atomic.Int32
	worker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/completions" {
			http.NotFound(w, r) // the gateway's reads of the engine's facts
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		if calls.Add(1) == 1 {
			<-r.Context().Done()
			return
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"x\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer worker.Close()
	tester := newTester(t)
	tester.InitServer(proxyCaddyfile(fmt.Sprintf(`		use_kv_events off
		worker 1 {
			endpoint %s
			model_name m
		}`, strings.TrimPrefix(worker.URL, "http://"))), "caddyfile")

	body := fmt.Sprintf(`{"model":"m","stream":true,"prompt":%s}`, tokensJSON(seqTokens(1, 64)))
	send := func(cancelAfterHeaders bool) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, apiBase+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		res, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		cached := res.Header.Get("X-KVRouter-Cached-Tokens")
		if cancelAfterHeaders {
			cancel()
		} else {
			_, _ = io.ReadAll(res.Body)
		}
		res.Body.Close()
		waitNoReservations(t)
		return cached
	}
	if got := send(true); got != "0" {
		t.Fatalf("first send: %s cached tokens promised, want 0", got)
	}
	if got := send(false); got != "0" {
		t.Fatalf("after a stream left at its headers: %s cached tokens promised, want 0 (nothing was prefilled)", got)
	}
	if got := send(false); got != "64" {
		t.Fatalf("after a stream that sent its first token: %s cached tokens promised, want 64", got)
	}
}
