package caddymodule

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestDiscoveredWorkersServeThroughCaddy: two vLLM stand-ins known only
// by the SRV records of a Service's ports, in a gateway with no block size
// and no worker: discovery adds them with their HTTP and KV-event
// endpoints, engine facts give them their model and block size, their
// events are followed, and a request for a prefix one of them holds is
// proxied to it. When its record goes away it leaves the catalog, and the
// requests go to the other; a reload takes the workers over as they are;
// when the config goes, discovery stops asking.
func TestDiscoveredWorkersServeThroughCaddy(t *testing.T) {
	tester := newTester(t)
	srv := startTestDNS(t)
	w1, w2 := newTestWorker(t, 1), newTestWorker(t, 2)
	const zone = "vllm.e2e.kvrouter.test."
	name := "_http._tcp." + zone
	ports := func(w *testWorker) (http, events uint16) {
		_, hp, _ := net.SplitHostPort(w.addr)
		h, _ := strconv.Atoi(hp)
		e, _ := strconv.Atoi(w.pubEP[strings.LastIndexByte(w.pubEP, ':')+1:])
		return uint16(h), uint16(e)
	}
	h1, e1 := ports(w1)
	h2, e2 := ports(w2)
	srv.setSRV(name, srvTo{"pod-1." + zone, h1}, srvTo{"pod-2." + zone, h2})
	srv.setSRV("_kv-events._tcp."+zone, srvTo{"pod-1." + zone, e1}, srvTo{"pod-2." + zone, e2})
	srv.setA("pod-1."+zone, "127.0.0.1")
	srv.setA("pod-2."+zone, "127.0.0.1")
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	tester.InitServer(factsCaddyfile(logFile, fmt.Sprintf(`		discover dns %s {
			kv_events_srv kv-events
			replay_port off
			refresh 1s
			resolver %s
		}`, name, srv.addr)), "caddyfile")

	id1, id2 := discoveredID(name, w1.addr), discoveredID(name, w2.addr)
	for _, w := range []struct {
		id  uint64
		tw  *testWorker
		tag string
	}{{id1, w1, "pod-1"}, {id2, w2, "pod-2"}} {
		rec := waitRecord(t, w.id, "discovered and read", func(r *selection.WorkerRecord) bool { return r.Schedulable() })
		if recordEndpoint(&rec) != w.tw.addr || strp(rec.KVEventsEndpoint) != w.tw.pubEP || rec.ModelName != "m" ||
			*rec.BlockSize != 4 || rec.ReplayEndpoint != nil {
			t.Fatalf("%s: %+v (events %s)", w.tag, rec, strp(rec.KVEventsEndpoint))
		}
		w.tw.waitSubscribed()
	}

	held := seqTokens(300, 32)
	w2.announce(held, 4)
	waitIndexed(t, id2, 8)
	res, text := post(t, tester, "/v1/completions", `{"model":"m","prompt":`+tokensJSON(held)+`}`)
	if res.StatusCode != 200 || res.Header.Get("X-KVRouter-Worker") != strconv.FormatUint(id2, 10) ||
		res.Header.Get("X-KVRouter-Cached-Tokens") != "32" {
		t.Fatalf("the prefix pod-2 holds: status %d, worker %q, cached %q: %s", res.StatusCode,
			res.Header.Get("X-KVRouter-Worker"), res.Header.Get("X-KVRouter-Cached-Tokens"), text)
	}
	waitNoReservations(t)
	metrics := adminGet(t, tester, "/metrics")
	if !strings.Contains(metrics, `kvrouter_discovered_workers{name="_http._tcp.vllm.e2e.kvrouter.test"} 2`) ||
		!strings.Contains(metrics, `kvrouter_discovery_resolutions_total{name="_http._tcp.vllm.e2e.kvrouter.test",outcome="ok"}`) {
		t.Errorf("metrics:\n%s", grepLines(metrics, "kvrouter_discover"))
	}

	srv.setSRV(name, srvTo{"pod-1." + zone, h1})
	gone := time.Now()
	for deadline := gone.Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, found := pooledState(t).router.Catalog().Worker(id2); !found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pod-2 never left the catalog")
		}
	}
	t.Logf("pod-2 left the catalog %v after its record (refresh 1s)", time.Since(gone).Round(10*time.Millisecond))
	res, _ = post(t, tester, "/v1/completions", `{"model":"m","prompt":`+tokensJSON(held)+`}`)
	if res.StatusCode != 200 || res.Header.Get("X-KVRouter-Worker") != strconv.FormatUint(id1, 10) {
		t.Fatalf("after pod-2 left: status %d, worker %q", res.StatusCode, res.Header.Get("X-KVRouter-Worker"))
	}
	waitNoReservations(t)
	// The removal is logged just after the catalog's delete, which the
	// wait above saw: waited for, not read once.
	removed := logLines(t, logFile, "discovered worker removed")
	for start := time.Now(); len(removed) == 0 && time.Since(start) < 5*time.Second; time.Sleep(20 * time.Millisecond) {
		removed = logLines(t, logFile, "discovered worker removed")
	}
	if len(removed) != 1 || removed[0]["worker_id"] != float64(id2) {
		t.Errorf("log of the removal: %v", removed)
	}

	// A reload (the new config starts before the old one stops) takes the
	// workers over as they are: nothing added again, nothing removed.
	tester.InitServer(factsCaddyfile(logFile, fmt.Sprintf(`		discover dns %s {
			kv_events_srv kv-events
			replay_port off
			refresh 2s
			resolver %s
		}`, name, srv.addr)), "caddyfile")
	time.Sleep(2500 * time.Millisecond)
	if _, found := pooledState(t).router.Catalog().Worker(id1); !found {
		t.Error("pod-1 left at the reload")
	}
	if added, removed := logLines(t, logFile, "discovered worker added"), logLines(t, logFile, "discovered worker removed"); len(added) != 2 || len(removed) != 1 {
		t.Errorf("after the reload: %d added and %d removed in the log, want 2 and 1", len(added), len(removed))
	}

	tester.InitServer(blankCaddyfile, "caddyfile")
	asked := srv.queries.Load()
	time.Sleep(2500 * time.Millisecond)
	if n := srv.queries.Load() - asked; n != 0 {
		t.Errorf("%d queries after the config without discovery was loaded", n)
	}
}
