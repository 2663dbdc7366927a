package main

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/indexer"
)

// loraFleet is a two-worker fleet where only worker 2 loads two adapters.
func loraFleet(t *testing.T) *Fleet {
	return newTestFleet(t, func(c *Config) {
		c.LoraModules = []LoraModule{{Name: "sql-lora", Path: "/adapters/sql"}, {Name: "chat-lora", Path: "/adapters/chat"}}
		c.LoraWorkers = []int{2}
	})
}

func TestAdapterIsServedOnlyWhereLoaded(t *testing.T) {
	f := loraFleet(t)
	body := map[string]any{"model": "sql-lora", "prompt": tokenRange(1, 40), "max_tokens": 1}
	res, b := postJSON(t, f.url(1)+"/v1/completions", body)
	if res.StatusCode != http.StatusNotFound || !strings.Contains(string(b), "The model `sql-lora` does not exist.") {
		t.Fatalf("worker 1 (no adapters): %d %s", res.StatusCode, b)
	}
	res, b = postJSON(t, f.url(1)+"/tokenize", map[string]any{"model": "sql-lora", "prompt": "x"})
	if res.StatusCode != http.StatusNotFound {
		t.Fatalf("worker 1 /tokenize: %d %s", res.StatusCode, b)
	}
	c := completeVia(t, f, 2, "/v1/completions", body)
	if c.Usage.PromptTokens != 40 {
		t.Fatalf("worker 2: %+v", *c.Usage)
	}
	res, b = postJSON(t, f.url(2)+"/v1/completions", with(body, "model", "other-lora"))
	if res.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown adapter: %d %s", res.StatusCode, b)
	}
	// The answer names the adapter, as vLLM's does.
	if !strings.Contains(string(mustPost(t, f.url(2)+"/v1/completions", body)), `"model":"sql-lora"`) {
		t.Fatal("answer does not name the adapter")
	}
}

// mustPost posts body and returns the answer's body, failing unless 200.
func mustPost(t *testing.T, url string, body any) []byte {
	t.Helper()
	res, b := postJSON(t, url, body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %s", url, res.StatusCode, b)
	}
	return b
}

func TestAdaptersHaveTheirOwnBlocks(t *testing.T) {
	f := loraFleet(t)
	z := newZMQClient(t)
	sub := z.subscribe(f, f.workers[1].engines[0].pub)
	p := tokenRange(1, 40)
	run := func(model string) int {
		c := completeVia(t, f, 2, "/v1/completions", map[string]any{"model": model, "prompt": p, "max_tokens": 1})
		return c.Usage.PromptTokensDetails.CachedTokens
	}
	if run("default") != 0 || run("sql-lora") != 0 || run("chat-lora") != 0 {
		t.Fatal("one model's blocks served another")
	}
	if got := run("sql-lora"); got != 32 {
		t.Fatalf("the adapter's own repeat cached %d, want 32", got)
	}
	// Three BlockStored events for the same tokens: one per model, each
	// named by its adapter, with hashes that never collide.
	var hashes [][]uint64
	for _, want := range []string{"", "sql-lora", "chat-lora"} {
		_, payload := recv(t, sub)
		d := decode(t, payload)
		if len(d.events) != 1 || d.events[0].Kind != indexer.Stored || d.events[0].LoraName != want {
			t.Fatalf("event %+v, want a BlockStored of lora_name %q", d.events, want)
		}
		if !slices.Equal(d.events[0].TokenIDs, p[:32]) || !slices.Equal(d.events[0].BlockHashes, blockHashes(p, 16, want, "")) {
			t.Fatalf("%q: event %+v", want, d.events[0])
		}
		hashes = append(hashes, d.events[0].BlockHashes)
	}
	for i := range hashes {
		for j := range i {
			for _, h := range hashes[i] {
				if slices.Contains(hashes[j], h) {
					t.Fatalf("models %d and %d share hash %x", i, j, h)
				}
			}
		}
	}
}

func TestModelsListsAdapters(t *testing.T) {
	f := loraFleet(t)
	type card struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		OwnedBy     string  `json:"owned_by"`
		Root        string  `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen *int    `json:"max_model_len"`
		Permission  []struct {
			Object string `json:"object"`
		} `json:"permission"`
	}
	list := func(id int) []card {
		status, body := get(t, f.url(id)+"/v1/models")
		var l struct {
			Object string `json:"object"`
			Data   []card `json:"data"`
		}
		if err := json.Unmarshal([]byte(body), &l); err != nil || status != http.StatusOK || l.Object != "list" {
			t.Fatalf("/v1/models: %d %s", status, body)
		}
		return l.Data
	}
	base := list(1)
	if len(base) != 1 {
		t.Fatalf("worker 1 lists %+v", base)
	}
	b := base[0]
	if b.ID != "default" || b.Object != "model" || b.OwnedBy != "vllm" || b.Root != "default" || b.Parent != nil ||
		b.MaxModelLen == nil || *b.MaxModelLen != 131072 || len(b.Permission) != 1 || b.Permission[0].Object != "model_permission" {
		t.Fatalf("base card %+v", b)
	}
	cards := list(2)
	if len(cards) != 3 || cards[1].ID != "sql-lora" || cards[2].ID != "chat-lora" {
		t.Fatalf("worker 2 lists %+v", cards)
	}
	for _, c := range cards[1:] {
		if c.Parent == nil || *c.Parent != "default" || !strings.HasPrefix(c.Root, "/adapters/") || c.MaxModelLen != nil {
			t.Fatalf("adapter card %+v", c)
		}
	}
}

func TestRegistrationNamesTheAdapters(t *testing.T) {
	f := loraFleet(t)
	if reg := f.workers[0].registration(); reg.LoraAdapters != nil || reg.MaxModelLen != 131072 {
		t.Fatalf("worker 1 registration %+v", reg)
	}
	if reg := f.workers[1].registration(); !slices.Equal(reg.LoraAdapters, []string{"sql-lora", "chat-lora"}) {
		t.Fatalf("worker 2 registers adapters %v", reg.LoraAdapters)
	}
}

func TestLoraFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"--workers", "4", "--lora-modules", "a=/p/a,b=/p/b", "--lora-workers", "1,3", "--admin", ""})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.LoraModules, []LoraModule{{"a", "/p/a"}, {"b", "/p/b"}}) || !slices.Equal(cfg.LoraWorkers, []int{1, 3}) {
		t.Fatalf("%+v %v", cfg.LoraModules, cfg.LoraWorkers)
	}
	if cfg.adaptersFor(2) != nil || len(cfg.adaptersFor(3)) != 2 {
		t.Fatal("adapters on the wrong workers")
	}
	for _, bad := range [][]string{
		{"--lora-modules", "nopath"},
		{"--lora-modules", "default=/x"}, // the base model's name
		{"--lora-modules", "a=/x,a=/y"},
		{"--lora-modules", "a=/x", "--lora-workers", "9"},
		{"--lora-workers", "one"},
	} {
		if _, err := parseFlags(append(bad, "--admin", "")); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
