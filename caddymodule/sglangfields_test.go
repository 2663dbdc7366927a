package caddymodule

import (
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// adapterRouter is a catalog of model m1 on two workers, the first of
// which serves the adapter ad1.
func adapterRouter(t *testing.T) *selection.Router {
	id1, id2, model, ep1, ep2, bs := uint64(1), uint64(2), "m1", "127.0.0.1:1", "127.0.0.1:2", uint32(16)
	return routerWith(t, nil,
		selection.WorkerRequest{WorkerID: &id1, ModelName: &model, Endpoint: &ep1, BlockSize: &bs, LoraAdapters: []string{"ad1"}},
		selection.WorkerRequest{WorkerID: &id2, ModelName: &model, Endpoint: &ep2, BlockSize: &bs})
}

// adapterOf resolves body's adapter as the handler does (a body without a
// model is m1's).
func adapterOf(t *testing.T, c *selection.Catalog, body string) (string, *selection.SelectRequest, *openAIRequest) {
	t.Helper()
	var o openAIRequest
	if err := selection.DecodeJSON([]byte(body), &o); err != nil {
		t.Fatal(err)
	}
	if o.Model == "" {
		o.Model = "m1"
	}
	req := &selection.SelectRequest{Partition: selection.Partition{ModelName: o.Model}}
	a := routeAdapter(c, req)
	if a == "" {
		a = sglangAdapter(c, req, &o.sglangFields)
	}
	return a, req, &o
}

// TestSGLangModelAdapterSpelling: "<model>:<adapter>" is split at the
// first colon with both parts trimmed, and an empty adapter is the base
// model alone, as SGLang parses it (" ad1" was an adapter no worker knew,
// and "m1:" a 404).
func TestSGLangModelAdapterSpelling(t *testing.T) {
	c := adapterRouter(t).Catalog()
	for model, want := range map[string]struct{ base, adapter string }{
		"m1:ad1":   {"m1", "ad1"},
		"m1: ad1":  {"m1", "ad1"},
		" m1 :ad1": {"m1", "ad1"},
		"m1:":      {"m1", ""},
		"m1:   ":   {"m1", ""},
		"m2:ad1":   {"m2:ad1", ""}, // no such base: left alone, a 404 later
	} {
		a, req, _ := adapterOf(t, c, `{"model":"`+model+`","prompt":"x"}`)
		if a != want.adapter || req.Partition.ModelName != want.base {
			t.Errorf("%q: model %q adapter %q; want %q and %q", model, req.Partition.ModelName, a, want.base, want.adapter)
		}
		if a == "ad1" && req.Placement.RoutingConstraints == nil {
			t.Errorf("%q: not kept to ad1's workers", model)
		}
	}
}

// TestSGLangBatchOfOneMembers: for a batch of one, SGLang's per-item
// members in their list form are read as the item's: the adapter of
// ["ad1"], the key of ["k"], the capped cache read of [true] and [0]
// (they were ignored: the request could go to a worker without ad1, or be
// promised blocks SGLang would not read).
func TestSGLangBatchOfOneMembers(t *testing.T) {
	c := adapterRouter(t).Catalog()
	for _, body := range []string{
		`{"text":["hello"],"lora_path":["ad1"]}`,
		`{"model":"m1","prompt":["hello"],"lora_path":["ad1"]}`,
	} {
		if a, req, _ := adapterOf(t, c, body); a != "ad1" || req.Placement.RoutingConstraints == nil {
			t.Errorf("%s: adapter %q, constraints %v; want ad1, its workers only", body, a, req.Placement.RoutingConstraints)
		}
	}
	if _, _, o := adapterOf(t, c, `{"text":["hello"],"extra_key":["k"]}`); !o.keyedApart() {
		t.Error(`extra_key ["k"] is not keyed apart`)
	}
	if _, _, o := adapterOf(t, c, `{"text":["hello"],"extra_key":[""]}`); o.keyedApart() {
		t.Error(`extra_key [""] is keyed apart`)
	}
	if _, _, o := adapterOf(t, c, `{"text":["hello"],"return_logprob":[true],"logprob_start_len":[0]}`); !o.capsCacheRead() {
		t.Error(`return_logprob [true], logprob_start_len [0] does not cap the cache read`)
	}
	if _, _, o := adapterOf(t, c, `{"text":["a","b"],"lora_path":["ad1","ad1"]}`); o.loraPath() != "" {
		t.Error("a batch of two's lora_path read as one adapter")
	}
}

// TestPromptOfOneCostsAsTheFlatList: a batch of one token list costs about
// what the same list sent flat costs (its element was copied by a generic
// JSON decoder first: 56 MB and 140-180 ms against 24 MB and 9-14 ms for
// 8 MiB). Allocation is compared, not time: the least of three runs each.
func TestPromptOfOneCostsAsTheFlatList(t *testing.T) {
	n := 1 << 20
	ids := make([]byte, 0, 2*n+2)
	for range n {
		ids = append(ids, "1,"...)
	}
	ids = append(ids, '1')
	flat := append(append([]byte(`{"input_ids":[`), ids...), "]}"...)
	one := selection.RawJSON(append(append([]byte(`[[`), ids...), "]]"...))
	flatAlloc := leastAlloc(func() {
		var g openAIRequest
		if err := selection.DecodeJSON(flat, &g); err != nil || len(g.inputIDs) != n+1 {
			t.Fatalf("flat: %v %d", err, len(g.inputIDs))
		}
	})
	oneAlloc := leastAlloc(func() {
		if _, ids, ok := promptOfOne(one, false); !ok || len(ids) != n+1 {
			t.Fatalf("batch of one: %v %d", ok, len(ids))
		}
	})
	if oneAlloc > flatAlloc*3/2 {
		t.Errorf("a batch of one allocated %d bytes, the same ids flat %d", oneAlloc, flatAlloc)
	}
}
