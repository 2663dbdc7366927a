package indexer

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestManagerFollowsMoreRanksThanZMQDefault: a gateway in front of 1,024
// workers needs more sockets than libzmq's default of 1,023 per context.
// The manager follows 1,100 worker ranks on real SUB sockets, most of them
// dialing a port nobody listens on, and the last one, past the default
// limit, still receives and applies a real publisher's events. Closing the
// manager stops them all.
func TestManagerFollowsMoreRanksThanZMQDefault(t *testing.T) {
	const workers = 1100
	if workers <= zmq.MaxSocketsDflt {
		t.Fatalf("the test must follow more than %d ranks", zmq.MaxSocketsDflt)
	}
	m, err := NewManager(New(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := m.zctx.GetMaxSockets(); n < 2*workers {
		t.Fatalf("the manager's ZMQ context allows %d sockets", n)
	}
	cfg := selection.DefaultConfig()
	cfg.UseKVEvents = true
	r, err := selection.NewRouter(cfg, selection.WithIndexer(m.Index), selection.WithCatalogHook(m.OnCatalogChange))
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		r.Close()
		if !closed {
			_ = m.Close()
		}
	})

	// A port that was free a moment ago: the idle listeners' connections
	// are refused and retried with libzmq's back-off, as for a worker
	// whose engine has not come up yet.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nobody := "tcp://" + ln.Addr().String()
	ln.Close()

	pctx, _ := zmq.NewContext()
	pub := newTestPublisher(t, pctx, true)
	t.Cleanup(func() { pub.close(); _ = pctx.Term() })

	var lastRec selection.WorkerRecord
	for id := uint64(1); id <= workers; id++ {
		ep := nobody
		if id == workers {
			ep = pub.pubEP
		}
		req := &selection.WorkerRequest{WorkerID: ptr(id), ModelName: ptr("m"), Endpoint: ptr(fmt.Sprintf("127.0.0.1:%d", 20000+id)),
			BlockSize: ptr(uint32(lbs)), KVEventsEndpoint: ptr(ep)}
		if id == workers {
			req.ReplayEndpoint = ptr(pub.replay)
		}
		rec, err := r.Catalog().UpsertWorker(req)
		if err != nil {
			t.Fatalf("worker %d: %v", id, err)
		}
		lastRec = rec
	}
	if n := m.Listeners(); n != workers {
		t.Fatalf("%d listeners for %d worker ranks", n, workers)
	}
	pub.waitSubscribed()
	prompt := testPrompt(3)
	pub.publish(chunk(EncodingMap, 0, prompt, 0, 10), true)
	eventually(t, "the last rank's events applied", func() bool { return m.stats.Batches.Load() >= 1 })
	if n := m.Index.Blocks(lastRec.Partition(), selection.Rank{WorkerID: workers}); n != 10 {
		t.Fatalf("the last rank holds %d blocks; want 10", n)
	}
	if lost := m.stats.Lost.Load(); lost != 0 {
		t.Fatalf("%d events lost", lost)
	}

	start := time.Now()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	t.Logf("%d listeners stopped in %v", workers, time.Since(start).Round(time.Millisecond))
}

// osThreads is the process's live OS thread count (Linux).
func osThreads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status")
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Skip("no thread count")
	return 0
}

// TestIdleListenersHoldNoThreads: a listener waits for its socket on Go's
// poller (in its ingest loop's set), not in a blocking libzmq call, so a thousand idle ranks do not
// cost a thousand OS threads (each woken ten times a second); and Stop
// ends the wait at once.
func TestIdleListenersHoldNoThreads(t *testing.T) {
	const n = 300
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	var stats Stats
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nobody := "tcp://" + ln.Addr().String()
	ln.Close()
	before := osThreads(t)
	listeners := make([]*Listener, 0, n)
	for i := range n {
		l, err := StartListener(zctx, New(), &stats, nil, ListenerConfig{Endpoint: nobody, Rank: selection.Rank{WorkerID: uint64(i + 1)}})
		if err != nil {
			t.Fatal(err)
		}
		if l.loop == nil && l.wait == nil {
			t.Fatal("the listener could not poll its socket's descriptor")
		}
		listeners = append(listeners, l)
	}
	time.Sleep(300 * time.Millisecond) // room for timeouts to fire, had the listeners any
	if grown := osThreads(t) - before; grown >= n/2 {
		t.Fatalf("%d idle listeners added %d OS threads", n, grown)
	}
	var wg sync.WaitGroup
	for _, l := range listeners {
		wg.Go(l.Stop)
	}
	wg.Wait()
}
