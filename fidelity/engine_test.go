package fidelity

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"
)

// modelCard is one entry of GET /v1/models.
type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	OwnedBy     string  `json:"owned_by"`
	Parent      *string `json:"parent"`
	MaxModelLen *int    `json:"max_model_len"`
}

// models lists the gateway's GET /v1/models.
func (g *gateway) models(t *testing.T) []modelCard {
	t.Helper()
	var list struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}
	getJSON(t, g.proxy+"/v1/models", &list)
	if list.Object != "list" {
		t.Fatalf("/v1/models: object %q", list.Object)
	}
	return list.Data
}

// /v1/models through the gateway lists the fleet's model once and every
// adapter once with its parent, however many workers serve them; a
// request naming an adapter lands only on the workers that loaded it, and
// its cached tokens are predicted as the engine reports them (the adapter
// salts both sides' block hashes); a model nobody serves is the gateway's
// own 404.
func TestModelsAndAdapters(t *testing.T) {
	g := startGateway(t)
	f := startFleet(t, g, 3, true, "--lora-modules", "sql=/adapters/sql,support=/adapters/support", "--lora-workers", "2")
	cards := g.models(t)
	byID := map[string]modelCard{}
	for _, c := range cards {
		if _, dup := byID[c.ID]; dup {
			t.Fatalf("/v1/models lists %q twice: %+v", c.ID, cards)
		}
		byID[c.ID] = c
	}
	if len(cards) != 3 || byID[model].Parent != nil || byID[model].MaxModelLen == nil {
		t.Fatalf("/v1/models: %+v", cards)
	}
	for _, a := range []string{"sql", "support"} {
		if c, ok := byID[a]; !ok || c.Parent == nil || *c.Parent != model {
			t.Fatalf("adapter %s: %+v", a, c)
		}
	}
	msgs := []map[string]any{{"role": "system", "content": words("schema", 80)}}
	for i := range 12 {
		g.settle(t, f)
		m := append(slices.Clone(msgs), map[string]any{"role": "user", "content": words(fmt.Sprintf("query%d_", i), 10)})
		a := g.post(t, "/v1/chat/completions", map[string]any{"model": "sql", "messages": m, "max_tokens": 4})
		if a.status != 200 {
			t.Fatalf("adapter request %d: %d %s", i, a.status, a.body)
		}
		if w := a.header.Get("X-Kvmock-Worker"); w != "2" {
			t.Fatalf("adapter request %d served by worker %s, which did not load it", i, w)
		}
		if a.usage.cached() != predicted(t, a) {
			t.Errorf("adapter request %d: reported %d cached, predicted %d", i, a.usage.cached(), predicted(t, a))
		}
		if i > 0 && a.usage.cached() < 64 {
			t.Errorf("adapter request %d: the shared schema was not found cached (%d)", i, a.usage.cached())
		}
	}
	// The base model on the same prefix shares nothing with the adapter.
	g.settle(t, f)
	a := g.post(t, "/v1/chat/completions", map[string]any{"model": model, "messages": msgs, "max_tokens": 4}, "X-Session-ID", "base")
	if a.status != 200 || a.usage.cached() != predicted(t, a) || a.usage.cached() != 0 {
		t.Fatalf("base model after the adapter's requests: %d, reported %d cached, predicted %d", a.status, a.usage.cached(), predicted(t, a))
	}
	a = g.post(t, "/v1/chat/completions", map[string]any{"model": "nope", "messages": msgs})
	var e struct {
		Error struct{ Message, Type string } `json:"error"`
	}
	if a.status != http.StatusNotFound || json.Unmarshal(a.body, &e) != nil || e.Error.Message != "The model `nope` does not exist." {
		t.Fatalf("unknown model: %d %s", a.status, a.body)
	}
}

// A worker registered with its endpoint and event addresses alone gets
// its model, block size, capacity and adapters from its engine, and is
// then routed by cache like any other.
func TestWorkerDeclaredByItsEndpointsAlone(t *testing.T) {
	g := startGateway(t)
	f := startFleet(t, g, 2, false, "--kv-blocks", "1000", "--lora-modules", "sql=/adapters/sql")
	var stats struct {
		Workers []struct {
			WorkerID         int    `json:"worker_id"`
			Endpoint         string `json:"endpoint"`
			KVEventsEndpoint string `json:"kv_events_endpoint"`
			ReplayEndpoint   string `json:"replay_endpoint"`
		} `json:"workers"`
	}
	getJSON(t, f.admin+"/stats", &stats)
	for _, w := range stats.Workers {
		g.register(t, map[string]any{"worker_id": w.WorkerID, "endpoint": w.Endpoint,
			"kv_events_endpoint": w.KVEventsEndpoint, "replay_endpoint": w.ReplayEndpoint})
	}
	g.waitSchedulable(t, len(stats.Workers))
	var recs []struct {
		WorkerID      int      `json:"worker_id"`
		ModelName     string   `json:"model_name"`
		BlockSize     int      `json:"block_size"`
		TotalKVBlocks int      `json:"total_kv_blocks"`
		LoraAdapters  []string `json:"lora_adapters"`
		MaxModelLen   int      `json:"max_model_len"`
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		getJSON(t, g.admin+"/kv_router/workers", &recs)
		done := len(recs) == len(stats.Workers)
		for _, r := range recs {
			done = done && r.TotalKVBlocks == 1000 && len(r.LoraAdapters) == 1
		}
		if done || time.Now().After(deadline) {
			break
		}
	}
	for _, r := range recs {
		if r.ModelName != model || r.BlockSize != blockSize || r.TotalKVBlocks != 1000 || !slices.Equal(r.LoraAdapters, []string{"sql"}) || r.MaxModelLen == 0 {
			t.Fatalf("worker %d as the engine told it: %+v", r.WorkerID, r)
		}
	}
	s := &session{id: "facts", tools: weatherTool, messages: []map[string]any{{"role": "system", "content": words("sys", 60)}}}
	for n := range 4 {
		g.settle(t, f)
		a := s.turn(t, g, n)
		if a.usage.cached() != predicted(t, a) || n > 0 && a.usage.cached() == 0 {
			t.Fatalf("turn %d: reported %d cached, predicted %d", n, a.usage.cached(), predicted(t, a))
		}
	}
}
