package caddymodule

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// soakReloads is how many forced reloads TestSoakReloadsUnderTraffic
// makes, one every 200–250 ms; shortSoakReloads under -short (make test
// runs the full soak).
const (
	soakReloads      = 40
	shortSoakReloads = 8
)

// TestSoakReloadsUnderTraffic reloads the gateway every few hundred ms
// while four clients send completions (half of them streamed) without a
// pause. Every request must be answered in full and served by a worker
// exactly once; afterwards the KV-event listeners, the site's listening
// socket and the index are as before, no reservation or load is left, and
// goroutines and descriptors come back to their count before the soak.
func TestSoakReloadsUnderTraffic(t *testing.T) {
	reloads := soakReloads
	if testing.Short() {
		reloads = shortSoakReloads
	}
	tester := newTester(t)
	w1, w2 := newTestWorker(t, 1), newTestWorker(t, 2)
	// Old configs' reverse_proxy transports are not closed by a reload:
	// their idle upstream connections go only after the keepalive idle
	// timeout (2 min by default). A short one lets the descriptor count
	// come back within the test.
	cfg := withUpstreamTransport(proxyCaddyfile(workerBlock(w1)+workerBlock(w2)), "keepalive 500ms")
	tester.InitServer(cfg, "caddyfile")
	t.Cleanup(func() { forceReload(t, blankCaddyfile) }) // before the workers close
	w1.waitSubscribed()
	w2.waitSubscribed()

	// Each client's prompt is a prefix one worker holds: the index must
	// keep steering it there through every reload.
	prompts := [4][]uint32{seqTokens(1000, 64), seqTokens(2000, 64), seqTokens(3000, 64), seqTokens(4000, 64)}
	owner := [4]*testWorker{w1, w2, w1, w2}
	for i, p := range prompts {
		owner[i].announce(p, 4)
	}
	waitIndexed(t, 1, 32)
	waitIndexed(t, 2, 32)
	state := pooledState(t)
	key := selection.PartitionKey{Model: "m", Group: "default"}

	client := freshConnClient()
	var sent, answered, resets, misrouted atomic.Int64
	var resetKinds sync.Map
	var failed failures
	fail := failed.add
	// one sends client c's request number i and checks its answer.
	one := func(c, i int) {
		stream := i%2 == 1
		body := fmt.Sprintf(`{"model":"m","stream":%t,"prompt":%s}`, stream, tokensJSON(prompts[c]))
		sent.Add(1)
		res, err := postRetryingResets(client, body, func(err error) {
			resets.Add(1)
			resetKinds.Store(err.Error()[strings.LastIndex(err.Error(), ": ")+2:], true)
		})
		if err != nil {
			fail("client %d request %d: %v", c, i, err)
			return
		}
		defer res.Body.Close()
		if res.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(res.Body)
			fail("client %d request %d: status %d %s", c, i, res.StatusCode, b)
			return
		}
		if res.Header.Get("X-KVRouter-Worker") != fmt.Sprint(owner[c].id) {
			misrouted.Add(1)
		}
		if stream {
			sc := bufio.NewScanner(res.Body)
			done := false
			for sc.Scan() {
				done = done || sc.Text() == "data: [DONE]"
			}
			if !done {
				fail("client %d request %d: stream cut: %v", c, i, sc.Err())
				return
			}
		} else if b, err := io.ReadAll(res.Body); err != nil || !strings.Contains(string(b), `"choices"`) {
			fail("client %d request %d: body %q, %v", c, i, b, err)
			return
		}
		answered.Add(1)
	}
	run := func(stop <-chan struct{}, limit int) {
		var wg sync.WaitGroup
		for c := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < limit; i++ {
					select {
					case <-stop:
						return
					default:
					}
					one(c, i)
				}
			}()
		}
		wg.Wait()
	}

	// Warm up (every code path once, pools filled), then let a reload
	// drop the warm-up's idle upstream connections, and take the baseline.
	run(nil, 10)
	forceReload(t, cfg)
	// The old servers shut down at once (the warm-up's client connections
	// are closed), and the old transports' idle upstream connections go
	// when their 500 ms keepalive runs out.
	waitNoConns(t, w1, w2)
	base := settledCounts(t)
	listenersBefore := state.events.Listeners()
	blocksBefore := state.events.Index.Blocks(key, selection.Rank{WorkerID: 1}) + state.events.Index.Blocks(key, selection.Rank{WorkerID: 2})
	servedBefore := w1.served.Load() + w2.served.Load()
	sentBefore, answeredBefore := sent.Load(), answered.Load()
	gen := state.gen()

	stop := make(chan struct{})
	traffic := make(chan struct{})
	go func() { run(stop, 1<<30); close(traffic) }()
	var peak processCounts
	next := time.Now()
	for range reloads {
		// One reload starts every 200–250 ms, however long each takes.
		next = next.Add(time.Duration(200+rand.IntN(50)) * time.Millisecond)
		time.Sleep(time.Until(next))
		forceReload(t, cfg)
		if c := countNow(t); c.goroutines > peak.goroutines {
			peak = c
		}
	}
	close(stop)
	<-traffic

	failed.report(t)
	reqs, ok := sent.Load()-sentBefore, answered.Load()-answeredBefore
	served := w1.served.Load() + w2.served.Load() - servedBefore
	if got := state.gen() - gen; got != reloads {
		t.Errorf("%d reloads happened, want %d", got, reloads)
	}
	if ok != reqs || served != reqs {
		t.Errorf("%d requests sent, %d answered in full, %d served by the workers: want all equal", reqs, ok, served)
	}
	if s := pooledState(t); s != state {
		t.Fatal("a reload replaced the pooled router")
	}
	if n := state.events.Listeners(); n != listenersBefore {
		t.Errorf("%d KV-event listeners after the reloads, %d before", n, listenersBefore)
	}
	if n := listeningSockets(t, testHTTPPort); n != 1 {
		t.Errorf("%d sockets listen on the site's port, want 1", n)
	}
	blocks := state.events.Index.Blocks(key, selection.Rank{WorkerID: 1}) + state.events.Index.Blocks(key, selection.Rank{WorkerID: 2})
	if blocks != blocksBefore {
		t.Errorf("the index holds %d blocks, %d before the reloads", blocks, blocksBefore)
	}
	waitNoReservations(t)
	checkIdleLoads(t, state.router)
	// The index still answers: each prompt goes to its worker, all cached.
	for c, p := range prompts {
		res, _ := post(t, tester, "/v1/completions", `{"model":"m","prompt":`+tokensJSON(p)+`}`)
		if res.StatusCode != 200 || res.Header.Get("X-KVRouter-Worker") != fmt.Sprint(owner[c].id) || res.Header.Get("X-KVRouter-Cached-Tokens") != "64" {
			t.Errorf("prompt %d after the soak: status %d, worker %q, cached %q", c, res.StatusCode, res.Header.Get("X-KVRouter-Worker"), res.Header.Get("X-KVRouter-Cached-Tokens"))
		}
	}
	waitNoReservations(t)

	// Same state as the baseline: a reload just made, nothing in flight.
	forceReload(t, cfg)
	backToBaseline(t, base, 2)
	after := settledCounts(t)
	var kinds []string
	resetKinds.Range(func(k, _ any) bool { kinds = append(kinds, fmt.Sprintf("%q", k)); return true })
	t.Logf("%d reloads, %d requests sent, %d answered in full, %d served by workers (%d went to another worker than their prefix's), %d resets retried %v; "+
		"peak during the soak %v; before %v, after %v; %d reservations left",
		state.gen()-gen-1, reqs, ok, served, misrouted.Load(), resets.Load(), kinds, peak, base, after, state.router.ActiveReservations())
}
