package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestStopWorker(t *testing.T) {
	f := newTestFleet(t, nil)
	complete(t, f, 2, tokenRange(1, 20), 1)
	admin(t, f, "/workers/2/stop")
	if _, err := http.Get(f.url(2) + "/health"); err == nil {
		t.Fatal("a stopped worker still serves HTTP")
	}
	// The rest of the fleet is unaffected.
	complete(t, f, 1, tokenRange(1, 20), 1)
	res, b := postJSON(t, f.adminURL()+"/workers/2/restart", "")
	if res.StatusCode != http.StatusConflict {
		t.Fatalf("restart of a stopped worker: %d %s", res.StatusCode, b)
	}
	s := f.stats()
	if !s.Workers[1].Stopped || s.Workers[0].Stopped || s.Workers[1].RequestsServed != 1 {
		t.Fatalf("stats %+v", s.Workers)
	}
	// A reset skips the stopped worker instead of waiting for it.
	if b := admin(t, f, "/reset"); !strings.Contains(string(b), `"reset_workers":1`) {
		t.Fatalf("reset: %s", b)
	}
}

func TestAdminErrors(t *testing.T) {
	f := newTestFleet(t, nil)
	for path, want := range map[string]int{
		"/workers/3/restart":                http.StatusNotFound,
		"/workers/0/stop":                   http.StatusNotFound,
		"/workers/x/restart":                http.StatusBadRequest,
		"/workers/1/drop_events":            http.StatusBadRequest,
		"/workers/1/drop_events?n=-1":       http.StatusBadRequest,
		"/workers/1/restart?rank=1":         http.StatusBadRequest,
		"/workers/1/drop_events?n=0":        http.StatusOK,
		"/workers/1/restart?rank=0":         http.StatusOK,
		"/workers/1/drop_events?n=5&rank=0": http.StatusOK,
	} {
		if res, b := postJSON(t, f.adminURL()+path, ""); res.StatusCode != want {
			t.Errorf("POST %s: %d %s, want %d", path, res.StatusCode, b, want)
		}
	}
}

func TestStatsEndpoint(t *testing.T) {
	f := newTestFleet(t, nil)
	p := tokenRange(1, 48)
	complete(t, f, 1, p, 3)
	complete(t, f, 1, p, 3)
	status, body := get(t, f.adminURL()+"/stats")
	if status != http.StatusOK {
		t.Fatalf("/stats: %d", status)
	}
	var s struct {
		Workers []struct {
			WorkerID         int     `json:"worker_id"`
			Endpoint         string  `json:"endpoint"`
			KVEventsEndpoint string  `json:"kv_events_endpoint"`
			RequestsServed   int     `json:"requests_served"`
			PromptTokens     int     `json:"prompt_tokens"`
			CachedTokens     int     `json:"cached_tokens"`
			GeneratedTokens  int     `json:"generated_tokens"`
			EventsPublished  int     `json:"events_published"`
			CachedBlocks     int     `json:"cached_blocks"`
			KVCacheUsage     float64 `json:"kv_cache_usage"`
		} `json:"workers"`
		Totals struct {
			RequestsServed int `json:"requests_served"`
		} `json:"totals"`
		CacheHitRate float64 `json:"cache_hit_rate"`
	}
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatal(err)
	}
	w := s.Workers[0]
	if len(s.Workers) != 2 || w.WorkerID != 1 || w.Endpoint != f.workers[0].addr || !strings.HasPrefix(w.KVEventsEndpoint, "tcp://127.0.0.1:") {
		t.Fatalf("stats %s", body)
	}
	// The second request recomputes the last block (the last prompt token is
	// always computed), but its hash is cached already: no second event.
	if w.RequestsServed != 2 || w.PromptTokens != 96 || w.CachedTokens != 32 || w.GeneratedTokens != 6 ||
		w.EventsPublished != 1 || w.CachedBlocks != 3 || w.KVCacheUsage != 0 || s.Totals.RequestsServed != 2 {
		t.Fatalf("stats %s", body)
	}
	if s.CacheHitRate < 0.33 || s.CacheHitRate > 0.34 {
		t.Fatalf("cache_hit_rate %v", s.CacheHitRate)
	}
}

func TestRegisterRetriesUntilTheGatewayAnswers(t *testing.T) {
	var mu sync.Mutex
	var bodies []map[string]any
	calls := 0
	gw := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls <= 2 { // still starting
			http.Error(rw, "not yet", http.StatusServiceUnavailable)
			return
		}
		if r.Method != http.MethodPost || r.URL.Path != "/workers" {
			http.Error(rw, "wrong route", http.StatusBadRequest)
			return
		}
		if r.Header.Get("Authorization") != "Bearer s3cret" {
			// The gateway's write_token: the fleet must send it.
			http.Error(rw, `{"error":"missing bearer token"}`, http.StatusUnauthorized)
			return
		}
		b, _ := io.ReadAll(r.Body)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		bodies = append(bodies, m)
		rw.WriteHeader(http.StatusCreated)
	}))
	defer gw.Close()
	f := newTestFleet(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.Register(ctx, gw.URL, "s3cret"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 2 {
		t.Fatalf("registered %d workers", len(bodies))
	}
	for i, b := range bodies {
		w := f.workers[i]
		want := map[string]any{
			"worker_id": float64(i + 1), "model_name": "default", "endpoint": w.addr,
			"kv_events_endpoint": w.engines[0].pub.PubEndpoint, "replay_endpoint": w.engines[0].pub.ReplayEndpoint,
			"block_size": float64(16), "total_kv_blocks": float64(256), "max_num_batched_tokens": float64(8192),
		}
		for k, v := range want {
			if b[k] != v {
				t.Errorf("worker %d: %s = %v, want %v", i+1, k, b[k], v)
			}
		}
	}
}

func TestRegisterGivesUpOnARejection(t *testing.T) {
	gw := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		http.Error(rw, `{"error":"bad"}`, http.StatusUnprocessableEntity)
	}))
	defer gw.Close()
	f := newTestFleet(t, nil)
	start := time.Now()
	err := f.Register(context.Background(), gw.URL, "")
	if err == nil || !strings.Contains(err.Error(), "422") || time.Since(start) > time.Second {
		t.Fatalf("err %v after %v", err, time.Since(start))
	}
}

func TestRegisterDataParallelWorker(t *testing.T) {
	f := newTestFleet(t, func(c *Config) { c.Workers, c.DPRanks = 1, 2 })
	reg := f.workers[0].registration()
	if reg.DataParallelSize != 2 || len(reg.KVEventsEndpoints) != 2 || reg.KVEventsEndpoint != "" || reg.ReplayEndpoint != "" ||
		reg.KVEventsEndpoints["1"] != f.workers[0].engines[1].pub.PubEndpoint {
		t.Fatalf("registration %+v", reg)
	}
}
