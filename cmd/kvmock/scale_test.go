package main

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// fleetStatsOf reads GET /stats.
func fleetStatsOf(t *testing.T, f *Fleet) fleetStats {
	t.Helper()
	status, body := get(t, f.adminURL()+"/stats")
	if status != http.StatusOK {
		t.Fatalf("/stats: %d %s", status, body)
	}
	var s fleetStats
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// waitStats polls /stats until cond holds, failing after a generous
// timeout (it checks correctness, not speed).
func waitStats(t *testing.T, f *Fleet, what string, cond func(fleetStats) bool) fleetStats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := fleetStatsOf(t, f)
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %d of %d ranks subscribed", what, s.SubscribedRanks, s.Ranks)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStatsReportSubscribers: /stats says which ranks' KV-event sockets
// have a subscriber, so a benchmark can wait for the gateway to listen
// before it loads the fleet. Once a rank shows subscribed, its very next
// batch reaches the subscriber (no slow-joiner loss), and a subscriber
// that goes away is no longer counted.
func TestStatsReportSubscribers(t *testing.T) {
	f := newTestFleet(t, nil)
	if s := fleetStatsOf(t, f); s.Ranks != 2 || s.SubscribedRanks != 0 {
		t.Fatalf("%d of %d ranks subscribed before anyone subscribed", s.SubscribedRanks, s.Ranks)
	}
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	sub, err := zctx.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetLinger(0)
	_ = sub.SetRcvtimeo(3 * time.Second)
	if err := sub.Connect(f.workers[1].engines[0].pub.PubEndpoint); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetSubscribe(""); err != nil {
		t.Fatal(err)
	}
	s := waitStats(t, f, "the subscription", func(s fleetStats) bool { return s.SubscribedRanks == 1 })
	if s.Workers[0].Subscriptions != 0 || s.Workers[1].Subscriptions != 1 || s.Workers[1].Ranks[0].Subscriptions != 1 {
		t.Fatalf("subscriptions per worker: %d, %d", s.Workers[0].Subscriptions, s.Workers[1].Subscriptions)
	}
	complete(t, f, 2, tokenRange(1, 40), 1)
	if seq, _ := recv(t, sub); seq != 0 {
		t.Fatalf("first batch received has seq %d", seq)
	}
	sub.Close()
	waitStats(t, f, "the unsubscription", func(s fleetStats) bool { return s.SubscribedRanks == 0 })
}

// TestFleetOf1024Workers: the scale run's fleet (1,024 workers: 2,048 ZMQ
// sockets, past libzmq's default of 1,023 per context) starts, serves its
// last worker, reports every rank, and stops.
func TestFleetOf1024Workers(t *testing.T) {
	if testing.Short() {
		t.Skip("1,024 workers")
	}
	f := newTestFleet(t, func(c *Config) { c.Workers = 1024 })
	if len(f.workers) != 1024 {
		t.Fatalf("%d workers", len(f.workers))
	}
	seen := map[string]bool{}
	for _, w := range f.workers {
		for _, ep := range []string{w.addr, w.engines[0].pub.PubEndpoint, w.engines[0].pub.ReplayEndpoint} {
			if ep == "" || seen[ep] {
				t.Fatalf("worker %d: endpoint %q missing or shared", w.id, ep)
			}
			seen[ep] = true
		}
	}
	complete(t, f, 1024, tokenRange(1, 40), 1)
	if s := fleetStatsOf(t, f); s.Ranks != 1024 || s.Totals.RequestsServed != 1 || s.Workers[1023].EventsPublished != 1 {
		t.Fatalf("ranks %d, requests %d, events of worker 1024: %d", s.Ranks, s.Totals.RequestsServed, s.Workers[1023].EventsPublished)
	}
	start := time.Now()
	f.Close()
	t.Logf("1,024 workers stopped in %v", time.Since(start).Round(time.Millisecond))
}
