package cluster

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// natsServer starts the official NATS server in-process on 127.0.0.1, on
// port (0: one the OS picks), and stops it with the test.
func natsServer(t testing.TB, port int) *server.Server {
	t.Helper()
	return natsServerIn(t, port, t.TempDir(), true)
}

// natsServerIn starts the official NATS server on port (0: any) with its
// JetStream store in dir, or without JetStream.
func natsServerIn(t testing.TB, port int, dir string, jetStream bool) *server.Server {
	t.Helper()
	if port == 0 {
		port = -1
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true,
		JetStream: jetStream, StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// waitCatalogSynced waits until every replica watches the catalog bucket.
func waitCatalogSynced(t *testing.T, replicas ...*Replica) {
	t.Helper()
	waitFor(t, 5*time.Second, "every replica watches the bucket", func() bool {
		for _, r := range replicas {
			if !r.Stats().CatalogSynced {
				return false
			}
		}
		return true
	})
}

// testRouter is a router with workers 1 and 2 (one rank each, block size
// 16), in approximate mode.
func testRouter(t *testing.T) *selection.Router {
	t.Helper()
	cfg := selection.DefaultConfig()
	cfg.UseKVEvents = false
	cfg.SessionAffinityTTL = time.Minute
	r, err := selection.NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	for _, id := range []uint64{1, 2} {
		ep, bs := "127.0.0.1:9", uint32(16)
		if _, err := r.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: &id, Endpoint: &ep, BlockSize: &bs}); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func startReplica(t *testing.T, r *selection.Router, url, name string, mutate func(*Config)) *Replica {
	t.Helper()
	cfg := Config{URLs: []string{url}, Name: name, Heartbeat: 50 * time.Millisecond, Lease: 300 * time.Millisecond,
		Fingerprint: 42, Version: "test"}
	if mutate != nil {
		mutate(&cfg)
	}
	rep, err := Start(r, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rep.Close)
	return rep
}

// reserve books a request on worker w with prompt blocks seq and prefill
// tokens.
func reserve(t *testing.T, r *selection.Router, id string, w uint64, seq []uint64, prefill uint64) {
	t.Helper()
	isl := max(uint64(len(seq)*16), prefill)
	_, err := r.CreateReservation(&selection.ReservationRequest{SelectionID: &id, WorkerID: &w,
		Prompt:                 selection.Prompt{SequenceHashes: seq, ISLTokens: &isl},
		EffectivePrefillTokens: &prefill})
	if err != nil {
		t.Fatal(err)
	}
}

// load is worker w's rank 0 load as r sees it.
func load(r *selection.Router, w uint64) selection.PotentialLoad {
	for _, m := range r.Queries().Loads("", "") {
		for _, l := range m.Loads {
			if l.WorkerID == w {
				return l
			}
		}
	}
	return selection.PotentialLoad{}
}

// waitFor polls cond until it holds or d passes; it reports how long it took.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start)
}

// same reports whether a and b see the same load on both workers.
func same(a, b *selection.Router) bool {
	return load(a, 1) == load(b, 1) && load(a, 2) == load(b, 2)
}

// joinedPair starts replicas "a" on router a and "b" on router b, both set
// as tune says (nil: the test defaults), and waits until each hears the
// other.
func joinedPair(t *testing.T, a, b *selection.Router, url string, tune func(*Config)) (ra, rb *Replica) {
	t.Helper()
	ra = startReplica(t, a, url, "a", tune)
	rb = startReplica(t, b, url, "b", tune)
	waitFor(t, 5*time.Second, "replicas hear each other", func() bool { return ra.Stats().Peers == 1 && rb.Stats().Peers == 1 })
	return ra, rb
}
