package cluster

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/caddy-kvrouter/selection"
	"github.com/kvrouter/caddy-kvrouter/selection/api"
)

// apiServer serves r's selection API over real HTTP, the way operators
// register workers.
func apiServer(t *testing.T, r *selection.Router) string {
	t.Helper()
	s := httptest.NewServer(api.NewHandler(r, 1<<20))
	t.Cleanup(s.Close)
	return s.URL
}

func call(t *testing.T, method, url, body string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		t.Fatalf("%s %s: %s", method, url, resp.Status)
	}
}

func register(t *testing.T, base string, id uint64, endpoint string) {
	call(t, http.MethodPost, base+"/workers", fmt.Sprintf(`{"worker_id":%d,"endpoint":%q,"block_size":16,"model_name":"m"}`, id, endpoint))
}

func endpointOn(r *selection.Router, id uint64) string {
	w, ok := r.Catalog().Worker(id)
	if !ok || w.Endpoint == nil {
		return ""
	}
	return *w.Endpoint
}

// TestCatalogWritesReachEveryReplica: a worker registered, changed and
// deleted through A's API is registered, changed and deleted on B; the
// workers each declares itself (testRouter's 1 and 2) stay its own, and
// nothing applied from the bucket is written back to it.
func TestCatalogWritesReachEveryReplica(t *testing.T) {
	s := natsServer(t, 0)
	a, b := testRouter(t), testRouter(t)
	ra := startReplica(t, a, s.ClientURL(), "a", nil)
	rb := startReplica(t, b, s.ClientURL(), "b", nil)
	waitCatalogSynced(t, ra, rb)
	base := apiServer(t, a)

	register(t, base, 7, "127.0.0.1:7007")
	waitFor(t, 3*time.Second, "B has A's worker", func() bool { return endpointOn(b, 7) == "127.0.0.1:7007" })
	call(t, http.MethodPatch, base+"/workers/7", `{"endpoint":"127.0.0.1:7008"}`)
	waitFor(t, 3*time.Second, "B has A's change", func() bool { return endpointOn(b, 7) == "127.0.0.1:7008" })
	if w, _ := b.Catalog().Worker(7); !w.Schedulable() || w.ModelName != "m" {
		t.Fatalf("B's copy: %+v", w)
	}
	call(t, http.MethodDelete, base+"/workers/7", "")
	waitFor(t, 3*time.Second, "B lost A's deleted worker", func() bool { _, ok := b.Catalog().Worker(7); return !ok })
	time.Sleep(200 * time.Millisecond) // room for an echo, if there were one
	if st := rb.Stats(); st.CatalogPublished != 0 {
		t.Fatalf("B wrote back what it applied: %d puts", st.CatalogPublished)
	}
	if st := ra.Stats(); st.CatalogPublished != 3 {
		t.Fatalf("A put %d writes, want 3", st.CatalogPublished)
	}
	for _, r := range []*selection.Router{a, b} {
		if len(r.Catalog().ListWorkers("", "")) != 2 {
			t.Fatalf("declared workers changed: %+v", r.Catalog().ListWorkers("", ""))
		}
	}
	// A worker B declares itself is not in the bucket: A does not get it.
	id, ep, bs := uint64(30), "127.0.0.1:30", uint32(16)
	if _, err := b.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: &id, Endpoint: &ep, BlockSize: &bs}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if _, ok := a.Catalog().Worker(30); ok {
		t.Fatal("a worker B declared reached A")
	}
}

// TestLateReplicaGetsCatalog: a replica that starts after workers were
// registered gets them from the bucket, and not one that was deleted.
func TestLateReplicaGetsCatalog(t *testing.T) {
	s := natsServer(t, 0)
	a := testRouter(t)
	ra := startReplica(t, a, s.ClientURL(), "a", nil)
	waitFor(t, 5*time.Second, "A watches the bucket", func() bool { return ra.Stats().CatalogSynced })
	base := apiServer(t, a)
	for id := uint64(10); id < 15; id++ {
		register(t, base, id, "127.0.0.1:"+strconv.FormatUint(id, 10))
	}
	call(t, http.MethodDelete, base+"/workers/12", "")
	// Worker 12's registration and deletion may leave in one put (the
	// pending table keeps the newest write per worker): 5 or 6 puts.
	waitFor(t, 10*time.Second, "A's writes are in the bucket", func() bool {
		ra.cat.mu.Lock()
		n := len(ra.cat.pending)
		ra.cat.mu.Unlock()
		return n == 0 && ra.Stats().CatalogPublished >= 5
	})

	b := testRouter(t)
	startReplica(t, b, s.ClientURL(), "b", nil)
	waitFor(t, 10*time.Second, "the late replica has the catalog", func() bool {
		return len(b.Catalog().ListWorkers("", "")) == 2+4
	})
	if _, ok := b.Catalog().Worker(12); ok {
		t.Fatal("the late replica has a deleted worker")
	}
}

// TestCatalogOutageConverges: writes made on both sides while NATS is
// down are shared when it returns (with its store), and the replicas end
// with the same catalog.
func TestCatalogOutageConverges(t *testing.T) {
	dir := t.TempDir()
	s := natsServerIn(t, 0, dir, true)
	url := s.ClientURL()
	port, _ := strconv.Atoi(url[strings.LastIndexByte(url, ':')+1:])
	a, b := testRouter(t), testRouter(t)
	ra := startReplica(t, a, url, "a", nil)
	rb := startReplica(t, b, url, "b", nil)
	waitCatalogSynced(t, ra, rb)
	baseA, baseB := apiServer(t, a), apiServer(t, b)
	register(t, baseA, 20, "127.0.0.1:20")
	waitFor(t, 3*time.Second, "B has worker 20", func() bool { return endpointOn(b, 20) != "" })

	s.Shutdown()
	s.WaitForShutdown()
	waitFor(t, 3*time.Second, "both alone", func() bool { return !ra.Stats().Connected && !rb.Stats().Connected })
	register(t, baseA, 21, "127.0.0.1:21")
	register(t, baseB, 22, "127.0.0.1:22")
	call(t, http.MethodDelete, baseB+"/workers/20", "")

	natsServerIn(t, port, dir, true)
	took := waitFor(t, 5*time.Second, "the catalogs converge", func() bool {
		for _, r := range []*selection.Router{a, b} {
			_, has20 := r.Catalog().Worker(20)
			if has20 || endpointOn(r, 21) == "" || endpointOn(r, 22) == "" {
				return false
			}
		}
		return true
	})
	t.Logf("catalogs converged %v after the server restarted", took)
}

// TestCatalogWithoutJetStream: on a server without JetStream the replicas
// still share bookings; the catalog stays local and the replica says so.
func TestCatalogWithoutJetStream(t *testing.T) {
	s := natsServerIn(t, 0, "", false)
	a, b := testRouter(t), testRouter(t)
	ra := startReplica(t, a, s.ClientURL(), "a", nil)
	startReplica(t, b, s.ClientURL(), "b", nil)
	waitFor(t, 5*time.Second, "A finds no bucket", func() bool { return ra.Stats().CatalogUnavailable > 0 })
	if ra.Stats().CatalogSynced {
		t.Fatal("catalog reported synced without JetStream")
	}
	reserve(t, a, "a1", 1, []uint64{1, 2}, 40)
	waitFor(t, 3*time.Second, "B still sees A's booking", func() bool { return load(b, 1).ActiveRequests == 1 })
	register(t, apiServer(t, a), 40, "127.0.0.1:40")
	time.Sleep(300 * time.Millisecond)
	if _, ok := b.Catalog().Worker(40); ok {
		t.Fatal("a catalog write crossed without a bucket")
	}
	if n := ra.Stats().CatalogUnavailable; n != 1 {
		t.Fatalf("bucket attempts without JetStream: %d, want 1 per connection", n)
	}
}

// bucketWriter puts raw entries in the catalog bucket on url, as whoever
// can write it (another replica's build, an operator's tool) would.
func bucketWriter(t *testing.T, url string) func(key, value string) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, bucketName(DefaultPrefix))
	if err != nil {
		t.Fatal(err)
	}
	return func(key, value string) {
		t.Helper()
		if _, err := kv.Put(ctx, key, []byte(value)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCatalogEntriesWhateverTheirWritersSettings: a bucket entry from a
// replica with another settings fingerprint or build is applied (it was
// refused, and a fleet whose settings all changed kept, on each replica,
// only the entries that replica wrote); one whose key is not its worker's
// id is dropped and counted; a write over the value bound is not put.
func TestCatalogEntriesWhateverTheirWritersSettings(t *testing.T) {
	s := natsServer(t, 0)
	b := testRouter(t)
	rb := startReplica(t, b, s.ClientURL(), "b", func(c *Config) { c.MaxCatalogValueBytes = 1024 })
	waitFor(t, 5*time.Second, "B watches the bucket", func() bool { return rb.Stats().CatalogSynced })
	put := bucketWriter(t, s.ClientURL())
	put("50", `{"origin":"x","fingerprint":7,"version":"test","worker":{"worker_id":50,"endpoint":"127.0.0.1:50","block_size":16}}`)
	put("51", `{"origin":"x","fingerprint":42,"version":"test","worker":{"worker_id":52,"endpoint":"127.0.0.1:51","block_size":16}}`)
	// Over the value bound: the server refuses it (the bucket's bound) and
	// so does B's side before it puts (counted).
	taints := strings.Repeat(`"`+strings.Repeat("t", 60)+`",`, 20)
	call(t, http.MethodPost, apiServer(t, b)+"/workers", `{"worker_id":53,"endpoint":"127.0.0.1:53","block_size":16,"taints":[`+taints+`"x"]}`)
	put("54", `{"origin":"x","fingerprint":42,"version":"test","worker":{"worker_id":54,"endpoint":"127.0.0.1:54","block_size":16}}`)
	put("55", `{"origin":"y","fingerprint":42,"version":"older","worker":{"worker_id":55,"endpoint":"127.0.0.1:55","block_size":16}}`)
	waitFor(t, 3*time.Second, "B applies the good entries", func() bool {
		return endpointOn(b, 50) != "" && endpointOn(b, 54) != "" && endpointOn(b, 55) != ""
	})
	st := rb.Stats()
	if st.Refused["fingerprint"]+st.Refused["version"] != 0 || st.Dropped["catalog_malformed"] != 1 || st.Dropped["catalog_oversize"] != 1 {
		t.Fatalf("refused %v dropped %v", st.Refused, st.Dropped)
	}
	if st.CatalogPublished != 0 {
		t.Fatal("an over-bound write was put")
	}
	_, _ = b.Catalog().DeleteWorker(53) // the local write stands locally
	for _, id := range []uint64{51, 52, 53} {
		if _, ok := b.Catalog().Worker(id); ok {
			t.Fatalf("worker %d applied", id)
		}
	}
}

// TestCatalogWriteVisibleLatency measures how long a worker registered
// through A's API takes to show in B's catalog, over 100 registrations on
// loopback (reported, not asserted: timing belongs to the figures).
func TestCatalogWriteVisibleLatency(t *testing.T) {
	s := natsServer(t, 0)
	a, b := testRouter(t), testRouter(t)
	ra := startReplica(t, a, s.ClientURL(), "a", nil)
	rb := startReplica(t, b, s.ClientURL(), "b", nil)
	waitCatalogSynced(t, ra, rb)
	base := apiServer(t, a)
	var lat []time.Duration
	for i := range 100 {
		id := uint64(1000 + i)
		start := time.Now()
		register(t, base, id, "127.0.0.1:"+strconv.Itoa(10000+i))
		for endpointOn(b, id) == "" {
			if time.Since(start) > 3*time.Second {
				t.Fatalf("worker %d not on B", id)
			}
			time.Sleep(20 * time.Microsecond)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	t.Logf("worker registered through A's API, in B's catalog: p50 %v p99 %v max %v (100 registrations, the HTTP call included)", lat[50], lat[98], lat[99])
}

// TestCatalogKeepsDeclaredWorkers: a bucket entry under the id of a worker
// this replica declares itself (its config, or discovery) does not
// replace it, and a deletion after it does not remove it; both are
// counted. It used to replace the declared record, and the deletion then
// removed the worker until the next reload.
func TestCatalogKeepsDeclaredWorkers(t *testing.T) {
	s := natsServer(t, 0)
	b := testRouter(t) // workers 1 and 2, declared: not written through the API
	rb := startReplica(t, b, s.ClientURL(), "b", nil)
	waitFor(t, 5*time.Second, "B watches the bucket", func() bool { return rb.Stats().CatalogSynced })
	put := bucketWriter(t, s.ClientURL())
	put("1", `{"origin":"x","fingerprint":42,"version":"test","worker":{"worker_id":1,"endpoint":"127.0.0.1:6666","block_size":16}}`)
	// The bucket keeps one value a key: the deletion waits until the
	// replacement was seen, or a watcher behind would see the deletion alone.
	waitFor(t, 3*time.Second, "B refuses the replacement", func() bool { return rb.Stats().Dropped["catalog_local"] == 1 })
	put("1", `{"origin":"x","fingerprint":42,"version":"test","deleted":true}`)
	// A worker the bucket brought may be changed through it, as before.
	put("60", `{"origin":"x","fingerprint":42,"version":"test","worker":{"worker_id":60,"endpoint":"127.0.0.1:60","block_size":16}}`)
	put("60", `{"origin":"x","fingerprint":42,"version":"test","worker":{"worker_id":60,"endpoint":"127.0.0.1:61","block_size":16}}`)
	waitFor(t, 3*time.Second, "B applies the entries for worker 60", func() bool { return endpointOn(b, 60) == "127.0.0.1:61" })
	if ep := endpointOn(b, 1); ep != "127.0.0.1:9" {
		t.Fatalf("declared worker 1: endpoint %q, want its own 127.0.0.1:9", ep)
	}
	if n := rb.Stats().Dropped["catalog_local"]; n != 1 {
		t.Fatalf("catalog_local drops: %d, want 1 (the replacement; the deletion is ignored as before)", n)
	}
}
