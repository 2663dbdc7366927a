package indexer

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Lookups as a gateway gets them: over HTTP, from another process.
//
// BenchmarkIngestFleetProcess's own lookups run on a goroutine that a
// timer wakes, which Go schedules next on its core; a gateway's lookup
// runs on a request's goroutine, woken by the network poller, which
// queues behind whatever is runnable. With LOOKUP_OVER=http the
// benchmark serves the same lookup on 127.0.0.1 and this test binary,
// started again as a client (lookupChildEnv), sends the requests, one
// every LOOKUP_EVERY (1 ms unless set), and times them end to end. The
// client is a third process that sleeps between requests, so the
// kernel wakes it at once; what its times add over the lookup's own is
// the loopback round trip (the same idle and during ingest) and the
// gateway's wait to run the request.

// lookupChildEnv, set to a URL, makes this test binary the client.
const lookupChildEnv = "INDEXER_LOOKUP_CHILD"

func init() {
	url := os.Getenv(lookupChildEnv)
	if url == "" {
		return
	}
	if err := runLookupChild(url, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "lookup client:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runLookupChild reads commands from in: "run EVERY" starts requests to
// url, one every EVERY (a duration), until "stop", which writes the
// latencies "lat P50 P99 N" (nanoseconds) to out. It returns at the end
// of in.
func runLookupChild(url string, in io.Reader, out io.Writer) error {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	var (
		stop chan struct{}
		done chan []time.Duration
	)
	lines := bufio.NewScanner(in)
	for lines.Scan() {
		switch f := strings.Fields(lines.Text()); {
		case len(f) == 2 && f[0] == "run":
			every, err := time.ParseDuration(f[1])
			if err != nil {
				return err
			}
			stop, done = make(chan struct{}), make(chan []time.Duration, 1)
			go func(stop <-chan struct{}, done chan<- []time.Duration) {
				done <- requestLatencies(client, url, every, stop)
			}(stop, done)
		case len(f) == 1 && f[0] == "stop" && stop != nil:
			close(stop)
			lat := <-done
			if len(lat) == 0 {
				return fmt.Errorf("no request answered")
			}
			slices.Sort(lat)
			p50, p99 := percentiles(lat)
			fmt.Fprintf(out, "lat %d %d %d\n", p50, p99, len(lat))
		default:
			return fmt.Errorf("command %q", lines.Text())
		}
	}
	return lines.Err()
}

// requestLatencies sends GET url at once and then every that often until
// stop, and returns how long each took, to its body's end. The first
// request goes out at once so that even a run shorter than every has one.
func requestLatencies(client *http.Client, url string, every time.Duration, stop <-chan struct{}) []time.Duration {
	var lat []time.Duration
	next := time.Now()
	for first := true; ; first = false {
		if !first {
			next = next.Add(every)
			select {
			case <-stop:
				return lat
			case <-time.After(time.Until(next)):
			}
		}
		t0 := time.Now()
		resp, err := client.Get(url)
		if err != nil {
			fmt.Fprintln(os.Stderr, "lookup client:", err)
			return lat
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			fmt.Fprintln(os.Stderr, "lookup client: status", resp.Status)
			return lat
		}
		lat = append(lat, time.Since(t0))
	}
}

// httpLookups is the benchmark's side: the server and the client process.
type httpLookups struct {
	srv   *httptest.Server
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
	every time.Duration
	// handled is how long each request's handler ran, since the last
	// start: the part of the client's latency spent in the lookup, apart
	// from waiting to be run and the round trip.
	mu      sync.Mutex
	handled []time.Duration
}

// startHTTPLookups serves prompt's lookup on x and starts the client.
func startHTTPLookups(b *testing.B, x *Index, prompt []uint32, every time.Duration) *httpLookups {
	if every <= 0 {
		every = time.Millisecond
	}
	h := &httpLookups{every: every}
	var hashPool = sync.Pool{New: func() any { return new([]uint64) }}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		t0 := time.Now()
		hp := hashPool.Get().(*[]uint64)
		defer hashPool.Put(hp)
		var m selection.Matches
		*hp = lookUp(x, prompt, *hp, &m)
		fmt.Fprintln(w, len(m.List))
		h.mu.Lock()
		h.handled = append(h.handled, time.Since(t0))
		h.mu.Unlock()
	}))
	var err error
	if h.cmd, h.in, h.out, err = startSelf(lookupChildEnv + "=" + h.srv.URL); err != nil {
		h.srv.Close()
		b.Fatal(err)
	}
	return h
}

// handlerPercentiles returns the p50 and p99 of the handler times since
// the last start (zero when none).
func (h *httpLookups) handlerPercentiles() (p50, p99 time.Duration) {
	h.mu.Lock()
	lat := slices.Clone(h.handled)
	h.mu.Unlock()
	if len(lat) == 0 {
		return 0, 0
	}
	slices.Sort(lat)
	return percentiles(lat)
}

// start has the client begin its requests.
func (h *httpLookups) start(b *testing.B) {
	h.mu.Lock()
	h.handled = h.handled[:0]
	h.mu.Unlock()
	if _, err := fmt.Fprintf(h.in, "run %s\n", h.every); err != nil {
		b.Fatal(err)
	}
}

// finish stops the requests and returns their p50 and p99.
func (h *httpLookups) finish(b *testing.B) (p50, p99 time.Duration) {
	if _, err := fmt.Fprintln(h.in, "stop"); err != nil {
		b.Fatal(err)
	}
	if !h.out.Scan() {
		b.Fatalf("lookup client ended: %v", h.out.Err())
	}
	var n int
	if _, err := fmt.Sscanf(h.out.Text(), "lat %d %d %d", &p50, &p99, &n); err != nil {
		b.Fatalf("lookup client: %q", h.out.Text())
	}
	return p50, p99
}

func (h *httpLookups) stop() {
	_ = h.in.Close()
	_ = h.cmd.Wait()
	h.srv.Close()
}

// lookupOverHTTP is LOOKUP_OVER=http (see httpLookups).
func lookupOverHTTP(b *testing.B) bool {
	switch s := os.Getenv("LOOKUP_OVER"); s {
	case "":
		return false
	case "http":
		return true
	default:
		b.Fatalf("LOOKUP_OVER=%q: only http", s)
		return false
	}
}

// idle runs the client for d with nothing else happening.
func (h *httpLookups) idle(b *testing.B, d time.Duration) (p50, p99 time.Duration) {
	h.start(b)
	time.Sleep(d)
	return h.finish(b)
}
