package caddymodule

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The three ways a request of TestCancelsAtScale ends, chosen by the
// client and told to the worker in a header.
const (
	cancelBeforeResponse = "before" // the client gives up before any response
	cancelMidStream      = "mid"    // after the headers and a first chunk
	completeStream       = "done"   // the stream runs to its end
)

// h2cProxyCaddyfile is proxyCaddyfile with cleartext HTTP/2 on both sides
// of the gateway: clients reach it with h2c, and it reaches the workers
// with h2c. Thousands of requests then share a few dozen connections
// instead of needing four descriptors each in this one process.
func h2cProxyCaddyfile(workers string) string {
	cfg := proxyCaddyfile(workers)
	cfg = strings.Replace(cfg, "\tkv_router {", "\tservers {\n\t\tprotocols h1 h2c\n\t}\n\tkv_router {", 1)
	// max_conns_per_host: with HTTP/2 it bounds the dials in progress, so
	// a burst of requests that find every connection full does not dial
	// one connection each. A short keepalive lets the idle ones go soon
	// after the test.
	return withUpstreamTransport(cfg, "versions h2c", "max_conns_per_host 64", "keepalive 500ms")
}

// shortCancelRequests is how many requests TestCancelsAtScale holds in
// flight under -short.
const shortCancelRequests = 1000

// TestCancelsAtScale holds cancelRequests requests in flight through the
// kv_router handler at once, each with its reservation, then has a third
// of the clients cancel before any response, a third cancel mid-stream and
// a third read their stream to the end. Every reservation must be freed,
// no load left on any worker, and goroutines and descriptors back to their
// count before.
//
// Under -short it holds at most shortCancelRequests.
//
// All connections are cleartext HTTP/2 (client → Caddy → workers), so
// 10,000 concurrent requests take about 40 connections on each hop (250
// streams each) rather than 40,000 descriptors.
func TestCancelsAtScale(t *testing.T) {
	tester := newTester(t)
	var arrived atomic.Int64
	release := make(chan struct{})
	// hold keeps every request at the worker until the client goes (the
	// cancelled ones) or the test releases it (the completed ones).
	hold := func(rw http.ResponseWriter, r *http.Request) bool {
		kind := r.Header.Get("X-Test-End")
		if kind == "" {
			return false
		}
		arrived.Add(1)
		if kind == cancelBeforeResponse {
			<-r.Context().Done()
			return true
		}
		rw.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(rw, "data: {\"chunk\":0}\n\n")
		rw.(http.Flusher).Flush()
		if kind == cancelMidStream {
			// Never ends by itself: the client's cancel must be what
			// ends it.
			<-r.Context().Done()
			return true
		}
		select {
		case <-release:
		case <-r.Context().Done():
			return true
		}
		fmt.Fprint(rw, "data: {\"chunk\":1}\n\ndata: [DONE]\n\n")
		return true
	}
	w1, w2 := newH2CTestWorker(t, 1, 250, hold), newH2CTestWorker(t, 2, 250, hold)
	// Each worker holds about 5,000 of the requests at once, past the
	// default bound of 4,096 reservations per rank.
	cfg := strings.Replace(h2cProxyCaddyfile(workerBlock(w1)+workerBlock(w2)), "block_size 4", "block_size 4\n\t\tmax_reservations_per_worker 10000", 1)
	tester.InitServer(cfg, "caddyfile")
	t.Cleanup(func() { forceReload(t, blankCaddyfile) }) // before the workers close
	w1.waitSubscribed()
	w2.waitSubscribed()
	// Half the prompts share a prefix worker 1 holds, so the index is
	// consulted and the reservations carry cached blocks as well as load.
	shared := seqTokens(50000, 32)
	w1.announce(shared, 4)
	waitIndexed(t, 1, 8)
	router := pooledState(t).router

	h2c := new(http.Protocols)
	h2c.SetUnencryptedHTTP2(true)
	// As for Caddy's upstreams, MaxConnsPerHost keeps the burst from
	// dialing a connection per request.
	transport := &http.Transport{Protocols: h2c, MaxConnsPerHost: 64}
	client := &http.Client{Transport: transport}
	// send makes request i, ending the way end says.
	send := func(ctx context.Context, i int, end string) (*http.Response, error) {
		prompt := seqTokens(100000+i*16, 16)
		if i%2 == 0 {
			prompt = append(append([]uint32(nil), shared...), prompt...)
		}
		body := fmt.Sprintf(`{"model":"m","stream":true,"prompt":%s}`, tokensJSON(prompt))
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, apiBase+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if end != "" {
			req.Header.Set("X-Test-End", end)
		}
		return client.Do(req)
	}
	// Warm up on the same path, then take the baseline without connections.
	for i := range 4 {
		res, err := send(context.Background(), i, "")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.ProtoMajor != 2 || res.StatusCode != 200 {
			t.Fatalf("warm-up: %s %d, want HTTP/2 200", res.Proto, res.StatusCode)
		}
	}
	transport.CloseIdleConnections()
	waitNoConns(t, w1, w2) // the upstream keepalive (500 ms) runs out
	base := settledCounts(t)

	n := cancelRequests
	if testing.Short() {
		// A quick run keeps every assertion at a tenth of the size (the
		// race run's size); make test runs the full size.
		n = min(n, shortCancelRequests)
	}
	t0 := time.Now()
	cancels := make([]context.CancelFunc, n)
	var started, ended sync.WaitGroup // started: a response's first chunk is read, or it is held before any
	var failed failures
	fail := failed.add
	var cancelled, cut, completed atomic.Int64
	cancelNow := make(chan struct{})
	ends := [3]string{cancelBeforeResponse, cancelMidStream, completeStream}
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		cancels[i] = cancel
		end := ends[i%3]
		started.Add(1)
		ended.Add(1)
		go func() {
			defer ended.Done()
			defer cancel()
			if end == cancelBeforeResponse {
				started.Done()
			}
			res, err := send(ctx, i, end)
			if end == cancelBeforeResponse {
				if errors.Is(err, context.Canceled) {
					cancelled.Add(1)
				} else {
					fail("request %d (%s): %v, want a cancel", i, end, err)
					if err == nil {
						res.Body.Close()
					}
				}
				return
			}
			if err != nil {
				started.Done()
				fail("request %d (%s): %v", i, end, err)
				return
			}
			defer res.Body.Close()
			rd := bufio.NewReader(res.Body)
			first, err := rd.ReadString('\n')
			started.Done()
			if res.StatusCode != 200 || err != nil || !strings.Contains(first, `"chunk":0`) {
				fail("request %d (%s): status %d, first line %q, %v", i, end, res.StatusCode, first, err)
				return
			}
			if end == cancelMidStream {
				<-cancelNow
				cancel()
				if _, err := io.ReadAll(rd); errors.Is(err, context.Canceled) {
					cut.Add(1)
				} else {
					fail("request %d (%s): reading after the cancel: %v", i, end, err)
				}
				return
			}
			if rest, err := io.ReadAll(rd); err == nil && strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
				completed.Add(1)
			} else {
				fail("request %d (%s): stream end %q, %v", i, end, rest, err)
			}
		}()
	}
	// Every request is at a worker, holding its reservation, at once.
	started.Wait()
	deadline := time.Now().Add(60 * time.Second)
	for arrived.Load() < int64(n) || router.ActiveReservations() < n {
		if time.Now().After(deadline) || failed.n.Load() > 0 {
			t.Fatalf("%d of %d requests reached a worker, %d reservations held, %d failed: %q", arrived.Load(), n, router.ActiveReservations(), failed.n.Load(), failed.kept())
		}
		time.Sleep(10 * time.Millisecond)
	}
	rampUp := time.Since(t0)
	peakReservations := router.ActiveReservations()
	peak := countNow(t)
	for i := 0; i < n; i += 3 {
		cancels[i]() // before any response
	}
	close(cancelNow) // mid-stream
	close(release)   // the rest complete
	ended.Wait()

	failed.report(t)
	if total := cancelled.Load() + cut.Load() + completed.Load(); total != int64(n) {
		t.Errorf("%d cancelled before a response, %d cut mid-stream, %d completed: %d of %d", cancelled.Load(), cut.Load(), completed.Load(), total, n)
	}
	waitNoReservations(t)
	checkIdleLoads(t, router)
	transport.CloseIdleConnections()
	backToBaseline(t, base, 2)
	after := settledCounts(t)
	t.Logf("%d requests in flight at once (%d reservations held, all reached after %v); %d cancelled before a response, %d cut mid-stream, %d completed; "+
		"peak %v; before %v, after %v; %d reservations left",
		n, peakReservations, rampUp.Round(time.Millisecond), cancelled.Load(), cut.Load(), completed.Load(), peak, base, after, router.ActiveReservations())
}
