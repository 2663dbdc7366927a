package api

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	json "github.com/goccy/go-json"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// getDump fetches GET /dump over HTTP and decodes it.
func getDump(t *testing.T, srv *httptest.Server) (map[string]selection.DumpPartition, *http.Response) {
	t.Helper()
	resp, err := http.Get(srv.URL + "/dump")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]selection.DumpPartition
	if err := json.Unmarshal(raw, &out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("dump: %d %v %.300s", resp.StatusCode, err, raw)
	}
	return out, resp
}

// TestDumpCap: MaxDumpEvents bounds the events over all partitions, taken
// in key order; a partition the cap cut says so, an empty one does not,
// and a cut partition's events are still parents first.
func TestDumpCap(t *testing.T) {
	tests := []struct {
		name      string
		cap       int
		events    map[string]int
		truncated map[string]bool
	}{
		{"no cap", 0, map[string]int{"a:default": 8, "b:default": 8, "c:default": 8, "d:default": 0}, map[string]bool{}},
		{"above the total", 100, map[string]int{"a:default": 8, "b:default": 8, "c:default": 8, "d:default": 0}, map[string]bool{}},
		{"exactly the total", 24, map[string]int{"a:default": 8, "b:default": 8, "c:default": 8, "d:default": 0}, map[string]bool{}},
		{"cuts the second", 10, map[string]int{"a:default": 8, "b:default": 2, "c:default": 0, "d:default": 0},
			map[string]bool{"b:default": true, "c:default": true}},
		{"the first partition whole", 8, map[string]int{"a:default": 8, "b:default": 0, "c:default": 0, "d:default": 0},
			map[string]bool{"b:default": true, "c:default": true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRouter(t, func(c *selection.Config) { c.MaxDumpEvents = tc.cap })
			for i, model := range []string{"a", "b", "c", "d"} {
				addWorker(t, r, uint64(i+1), func(w *selection.WorkerRequest) { w.ModelName = ptr(model); w.BlockSize = ptr(uint32(4)) })
				if model == "d" {
					continue // a partition with an empty index
				}
				res, err := r.SelectAndReserve(&selection.SelectRequest{Partition: selection.Partition{ModelName: model}, Prompt: selection.Prompt{TokenIDs: make([]uint32, 32)}})
				if err != nil {
					t.Fatal(err)
				}
				_ = r.Free(res.SelectionID)
			}
			srv := httptest.NewServer(NewHandler(r, 0))
			defer srv.Close()
			got, _ := getDump(t, srv)
			for name, d := range map[string]map[string]selection.DumpPartition{"http": got, "Dump": r.Queries().Dump()} {
				if len(d) != 4 {
					t.Fatalf("%s: %d partitions", name, len(d))
				}
				for key, want := range tc.events {
					p := d[key]
					if len(p.Events) != want || p.Truncated != tc.truncated[key] || p.BlockSize != 4 {
						t.Errorf("%s %s: %d events, truncated %v, want %d, %v", name, key, len(p.Events), p.Truncated, want, tc.truncated[key])
					}
					for i, ev := range p.Events {
						parent := ev.Event.Data.Stored.ParentHash
						if (i == 0) != (parent == nil) || i > 0 && *parent != p.Events[i-1].Event.Data.Stored.Blocks[0].BlockHash {
							t.Fatalf("%s %s: event %d is not chained to the one before", name, key, i)
						}
					}
				}
			}
		})
	}
}

// TestDumpTruncatedIsAnExtension: the wire form keeps Dynamo's shape and
// adds "truncated" only where the cap cut.
func TestDumpTruncatedIsAnExtension(t *testing.T) {
	r := newTestRouter(t, func(c *selection.Config) { c.MaxDumpEvents = 1 })
	addWorker(t, r, 1, func(w *selection.WorkerRequest) { w.BlockSize = ptr(uint32(4)) })
	addWorker(t, r, 2, func(w *selection.WorkerRequest) { w.ModelName = ptr("z"); w.BlockSize = ptr(uint32(4)) })
	res, err := r.SelectAndReserve(&selection.SelectRequest{Prompt: selection.Prompt{TokenIDs: make([]uint32, 8)}})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Free(res.SelectionID)
	srv := httptest.NewServer(NewHandler(r, 0))
	defer srv.Close()
	raw := call(t, srv, "GET", "/dump", "", "").raw
	want := `{"default:default":{"block_size":4,"events":[{"worker_id":1,"storage_tier":"device","event":{"event_id":0,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":`
	if len(raw) < len(want) || raw[:len(want)] != want {
		t.Fatalf("dump %s", raw)
	}
	tail := `}],"truncated":true},"z:default":{"block_size":4,"events":[]}}`
	if raw[len(raw)-len(tail):] != tail {
		t.Fatalf("dump %s", raw)
	}
}

// limitedIndex is an event-fed index whose partition holds n events,
// generated on demand; it serves only DumpLimit and records the limits.
type limitedIndex struct {
	t      *testing.T
	n      int
	mu     sync.Mutex
	limits []int
}

func (x *limitedIndex) FindMatches(selection.PartitionKey, []uint64, *selection.Matches) {}
func (x *limitedIndex) RemoveWorker(selection.PartitionKey, uint64)                      {}
func (x *limitedIndex) Dump(selection.PartitionKey) []selection.RouterEvent {
	x.t.Error("the router built a whole partition although the index can dump part of it")
	return nil
}

func (x *limitedIndex) DumpLimit(_ selection.PartitionKey, limit int) ([]selection.RouterEvent, bool) {
	x.mu.Lock()
	x.limits = append(x.limits, limit)
	x.mu.Unlock()
	n := x.n
	if limit > 0 && limit < n {
		n = limit
	}
	out := make([]selection.RouterEvent, n)
	for i := range out {
		out[i] = selection.RouterEvent{WorkerID: 1, StorageTier: "device", Event: selection.KVEvent{EventID: uint64(i),
			Data: selection.StoredData{Stored: selection.StoredEvent{Blocks: []selection.StoredBlock{{BlockHash: uint64(i)}}}}}}
	}
	return out, n < x.n
}

// TestDumpUsesDumpLimiter: with an index that implements DumpLimiter (the
// event-fed index does) a million-event partition is asked for at most the
// cap, never dumped whole, and the answer is streamed (chunked, with no
// Content-Length: it was never built as one buffer).
func TestDumpUsesDumpLimiter(t *testing.T) {
	idx := &limitedIndex{t: t, n: 1_000_000}
	cfg := selection.DefaultConfig()
	cfg.MaxDumpEvents = 5000
	r, err := selection.NewRouter(cfg, selection.WithIndexer(idx))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i, model := range []string{"a", "b"} {
		addWorker(t, r, uint64(i+1), func(w *selection.WorkerRequest) {
			w.ModelName = ptr(model)
			w.KVEventsEndpoint = ptr("tcp://127.0.0.1:" + strconv.Itoa(5557+i))
		})
	}
	srv := httptest.NewServer(NewHandler(r, 0))
	defer srv.Close()
	got, resp := getDump(t, srv)
	if a := got["a:default"]; len(a.Events) != 5000 || !a.Truncated {
		t.Fatalf("a: %d events, truncated %v", len(a.Events), a.Truncated)
	}
	if b := got["b:default"]; len(b.Events) != 0 || !b.Truncated {
		t.Fatalf("b: %d events, truncated %v", len(b.Events), b.Truncated)
	}
	if resp.ContentLength != -1 || len(resp.TransferEncoding) == 0 || resp.TransferEncoding[0] != "chunked" {
		t.Fatalf("not streamed: content length %d, transfer encoding %v", resp.ContentLength, resp.TransferEncoding)
	}
	idx.mu.Lock()
	defer idx.mu.Unlock()
	if len(idx.limits) != 2 || idx.limits[0] != 5000 || idx.limits[1] != 1 {
		t.Fatalf("limits asked: %v", idx.limits)
	}
}

// TestDumpsTakeTurns: while one dump runs, another waits for it, and gives
// up with its client; once the first ends, the waiting one is served.
func TestDumpsTakeTurns(t *testing.T) {
	r := newTestRouter(t, nil)
	addWorker(t, r, 1, nil)
	h := NewHandler(r, 0)
	srv := httptest.NewServer(h)
	defer srv.Close()
	h.dumping <- struct{}{} // a dump is running

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/dump", nil)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("a dump was answered (%d) while another ran", resp.StatusCode)
	}

	done := make(chan int, 1)
	go func() {
		resp, err := http.Get(srv.URL + "/dump")
		if err != nil {
			done <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	select {
	case code := <-done:
		t.Fatalf("a dump was answered (%d) while another ran", code)
	case <-time.After(100 * time.Millisecond):
	}
	<-h.dumping // the running dump ends
	select {
	case code := <-done:
		if code != http.StatusOK {
			t.Fatalf("the waiting dump: %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting dump was not served after the first ended")
	}
	// The one whose client gave up left nothing held: a third runs too.
	getDump(t, srv)
}

// TestDumpNotHeldByAStalledClient: a client that asks for a dump and
// never reads it (its receive buffer 4 KiB) holds the dump's turn only
// until a write is not taken within the write bound; the next dump is
// then served whole. Before the bound, the second waited for as long as
// the first kept its connection open.
func TestDumpNotHeldByAStalledClient(t *testing.T) {
	idx := &limitedIndex{t: t, n: 100_000} // about 13 MB of events
	cfg := selection.DefaultConfig()
	r, err := selection.NewRouter(cfg, selection.WithIndexer(idx))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	addWorker(t, r, 1, func(w *selection.WorkerRequest) { w.KVEventsEndpoint = ptr("tcp://127.0.0.1:5557") })
	h := NewHandler(r, 0)
	// Long enough that the second client, which reads as fast as it can,
	// takes each 32 KiB in time on a loaded machine under -race (at 300 ms
	// one CI run cut it short); the stalled one is cut after it.
	h.dumpWriteTimeout = 2 * time.Second
	srv := httptest.NewServer(h)
	defer srv.Close()

	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	stalled, err := d.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	if _, err := io.WriteString(stalled, "GET /dump HTTP/1.1\r\nHost: gateway\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(h.dumping) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the stalled client's dump did not start")
		}
		time.Sleep(time.Millisecond)
	}
	client := http.Client{Timeout: 30 * time.Second}
	resp, err := client.Get(srv.URL + "/dump")
	if err != nil {
		t.Fatalf("a dump behind a stalled one: %v", err)
	}
	defer resp.Body.Close()
	var got map[string]selection.DumpPartition
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != 200 {
		t.Fatalf("a dump behind a stalled one: %d %v", resp.StatusCode, err)
	}
	if n := len(got["default:default"].Events); n != 100_000 {
		t.Fatalf("%d events, want 100,000", n)
	}
}
