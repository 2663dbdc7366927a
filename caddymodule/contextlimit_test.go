package caddymodule

import (
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// idsPrompt is a completion body whose prompt is n token ids, with extra
// members appended.
func idsPrompt(model string, n int, extra string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"model":%q%s,"prompt":[`, model, extra)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, i+1)
	}
	b.WriteString("]}")
	return b.String()
}

// routingTokensOf runs what the handler routes body by, on model's
// partition.
func routingTokensOf(t *testing.T, h *Handler, model, body string) []uint32 {
	t.Helper()
	var o openAIRequest
	if err := selection.DecodeJSON([]byte(body), &o); err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/v1/completions", nil)
	part := selection.Partition{ModelName: model}
	toks, _ := h.routingTokens(r, &o, part.Key(), "")
	return toks
}

// TestPromptOverContextIsRoutedByLoad: a prompt of token ids longer than
// every worker of its model takes (their largest max_model_len) is one
// the engine refuses: it is routed by load, not hashed or booked. A
// prompt cut to fit by truncate_prompt_tokens is routed by its tokens,
// as is any prompt of a model whose context is not known. A catalog
// change is seen at once.
func TestPromptOverContextIsRoutedByLoad(t *testing.T) {
	w := func(id uint64, model string, maxLen uint64) selection.WorkerRequest {
		ep, bs := fmt.Sprintf("127.0.0.1:%d", 9000+id), uint32(16)
		req := selection.WorkerRequest{WorkerID: &id, ModelName: &model, Endpoint: &ep, BlockSize: &bs}
		if maxLen > 0 {
			req.MaxModelLen = &maxLen
		}
		return req
	}
	router := routerWith(t, nil, w(1, "m", 100), w(2, "m", 200), w(3, "n", 0))
	h := &Handler{router: router, contexts: newContextLimits(router.Catalog())}
	for _, tc := range []struct {
		model string
		n     int
		extra string
		want  int // tokens routed by; 0: by load
	}{
		{"m", 184, "", 184}, // max_tokens is 16 when absent
		{"m", 185, "", 0},
		{"m", 199, `,"max_tokens":null`, 199},
		{"m", 200, `,"max_tokens":null`, 0}, // vLLM refuses a prompt that leaves no room for an answer
		{"m", 150, `,"max_tokens":50`, 150},
		{"m", 150, `,"max_tokens":"51"`, 0},
		{"m", 4000, "", 0},
		{"m", 4000, `,"truncate_prompt_tokens":150`, 150},
		{"n", 100000, "", 100000},
		{"unknown", 300, "", 300},
	} {
		toks := routingTokensOf(t, h, tc.model, idsPrompt(tc.model, tc.n, tc.extra))
		if len(toks) != tc.want || (tc.want == 0) != (toks == nil) {
			t.Errorf("%s, %d ids%s: routed by %d tokens (nil %v), want %d", tc.model, tc.n, tc.extra, len(toks), toks == nil, tc.want)
		}
	}
	if len(h.contexts.byPart) != 2 {
		t.Errorf("kept figures for %d partitions, want 2 (a name no worker serves is not kept)", len(h.contexts.byPart))
	}
	longer := uint64(500)
	if _, err := router.Catalog().PatchWorker(2, &selection.WorkerRequest{MaxModelLen: &longer}); err != nil {
		t.Fatal(err)
	}
	if toks := routingTokensOf(t, h, "m", idsPrompt("m", 400, "")); len(toks) != 400 {
		t.Fatalf("after a worker's context grew to 500: routed by %d tokens, want 400", len(toks))
	}
}

// TestPromptEmbedsAreRoutedByLoad: vLLM prefills prompt embeddings (with
// --enable-prompt-embeds), alone or as a batch beside the prompt, and
// hashes them into its blocks; the gateway cannot, so such a request is
// routed by load where it was routed by its prompt's tokens alone.
func TestPromptEmbedsAreRoutedByLoad(t *testing.T) {
	router := routerWith(t, nil)
	h := &Handler{router: router, contexts: newContextLimits(router.Catalog())}
	if toks := routingTokensOf(t, h, "m", idsPrompt("m", 64, `,"prompt_embeds":"AAAA"`)); toks != nil {
		t.Fatalf("a prompt beside prompt_embeds was routed by its %d tokens", len(toks))
	}
	if toks := routingTokensOf(t, h, "m", idsPrompt("m", 64, `,"prompt_embeds":null`)); len(toks) != 64 {
		t.Fatalf("prompt_embeds null: routed by %d tokens, want 64", len(toks))
	}
}

// contextWorker registers worker id of model m with the context maxLen
// (0: none reported).
func contextWorker(id uint64, maxLen uint64) selection.WorkerRequest {
	ep, bs, model := fmt.Sprintf("127.0.0.1:%d", 9000+id), uint32(16), "m"
	req := selection.WorkerRequest{WorkerID: &id, ModelName: &model, Endpoint: &ep, BlockSize: &bs}
	if maxLen > 0 {
		req.MaxModelLen = &maxLen
	}
	return req
}

// TestContextFitting: a request that fits some of its partition's
// workers' contexts and not others' is sent only to those it fits;
// workers that did not report a context are never left out. With few
// distinct contexts the sets are made once and shared (a request
// allocates nothing); with many, each such request makes its own.
func TestContextFitting(t *testing.T) {
	ids := func(set map[uint64]bool) []uint64 {
		if set == nil {
			return nil
		}
		out := slices.Collect(maps.Keys(set))
		slices.Sort(out)
		return out
	}
	part := selection.PartitionKey{Model: "m"}
	t.Run("tiers", func(t *testing.T) {
		router := routerWith(t, nil, contextWorker(1, 4096), contextWorker(2, 65536), contextWorker(3, 0), contextWorker(4, 8192))
		c := newContextLimits(router.Catalog())
		for _, tc := range []struct {
			need uint64
			want []uint64
		}{
			{4096, nil},
			{4097, []uint64{2, 3, 4}},
			{8192, []uint64{2, 3, 4}},
			{8193, []uint64{2, 3}},
			{1 << 20, []uint64{3}},
		} {
			if over, got := c.place(part, "", tc.need); over || !slices.Equal(ids(got.allowed), tc.want) {
				t.Errorf("need %d: over %v, allowed %v; want %v", tc.need, over, ids(got.allowed), tc.want)
			}
		}
		if n := testing.AllocsPerRun(100, func() { c.place(part, "", 5000) }); n != 0 {
			t.Errorf("a request fitting some workers allocated %v times", n)
		}
		narrowed, over := contextFiltered.WithLabelValues("m", "narrowed"), contextFiltered.WithLabelValues("m", "over")
		n0, o0 := testCounter(narrowed), testCounter(over)
		c.place(part, "", 100)
		c.place(part, "", 5000)
		if dn, do := testCounter(narrowed)-n0, testCounter(over)-o0; dn != 1 || do != 0 {
			t.Errorf("counted %v narrowed and %v over, want 1 and 0", dn, do)
		}
	})
	t.Run("many contexts", func(t *testing.T) {
		var workers []selection.WorkerRequest
		for id := uint64(1); id <= maxContextTiers+2; id++ {
			workers = append(workers, contextWorker(id, 1000*id))
		}
		router := routerWith(t, nil, workers...)
		c := newContextLimits(router.Catalog())
		if over, got := c.place(part, "", 4500); over || !slices.Equal(ids(got.allowed), []uint64{5, 6}) || got.context != 5000 {
			t.Errorf("need 4500: over %v, allowed %v of context %d; want [5 6] of 5000", over, ids(got.allowed), got.context)
		}
		o0 := testCounter(contextFiltered.WithLabelValues("m", "over"))
		if over, _ := c.place(part, "", 6001); !over {
			t.Error("past every worker's context, not over")
		}
		if d := testCounter(contextFiltered.WithLabelValues("m", "over")) - o0; d != 1 {
			t.Errorf("counted %v over, want 1", d)
		}
	})
}

// BenchmarkContextPlace: the context filter on a request that fits half
// of 1,024 workers (two contexts), the figures made once.
func BenchmarkContextPlace(b *testing.B) {
	var workers []selection.WorkerRequest
	for id := uint64(1); id <= 1024; id++ {
		workers = append(workers, contextWorker(id, 4096<<(id%2)))
	}
	router := routerWith(b, nil, workers...)
	c := newContextLimits(router.Catalog())
	part := selection.PartitionKey{Model: "m"}
	b.ReportAllocs()
	for b.Loop() {
		if _, fit := c.place(part, "", 5000); len(fit.allowed) != 512 {
			b.Fatal(len(fit.allowed))
		}
	}
}

// TestContextNeed reads the answer's bound as each engine route does:
// vLLM's completions take 16 when max_tokens is absent and what the
// context leaves when it is null; its chat takes max_completion_tokens or
// max_tokens as Python's "or" does; SGLang's /generate refuses a total
// that reaches the context.
func TestContextNeed(t *testing.T) {
	for _, tc := range []struct {
		path, body string
		want       uint64
	}{
		{"/v1/completions", `{}`, 116},
		{"/v1/completions", `{"max_tokens":null}`, 101},
		{"/v1/completions", `{"max_tokens":20}`, 120},
		{"/v1/completions", `{"max_tokens":"2_0"}`, 120},
		{"/v1/completions", `{"max_tokens":20,"max_completion_tokens":30}`, 120},
		{"/v1/completions", `{"max_tokens":-5}`, 101},
		{"/v1/chat/completions", `{}`, 101},
		{"/v1/chat/completions", `{"max_tokens":20,"max_completion_tokens":30}`, 130},
		{"/v1/chat/completions", `{"max_tokens":20,"max_completion_tokens":0}`, 120},
		{"/v1/chat/completions", `{"max_tokens":20,"max_completion_tokens":null}`, 120},
		{"/v1/chat/completions", `{"max_tokens":false}`, 101},
		{"/generate", `{}`, 101},
		{"/generate", `{"sampling_params":{"max_new_tokens":30}}`, 131},
		{"/generate", `{"sampling_params":[{"max_new_tokens":30}]}`, 131},
		{"/generate", `{"sampling_params":[{"max_new_tokens":30},{"max_new_tokens":40}]}`, 101},
		{"/generate", `{"sampling_params":{"temperature":0}}`, 101},
		{"/generate", `{"max_tokens":30}`, 101},
	} {
		var o openAIRequest
		if err := selection.DecodeJSON([]byte(tc.body), &o); err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest(http.MethodPost, tc.path, nil)
		if got := o.contextNeed(r, 100); got != tc.want {
			t.Errorf("%s %s: need %d, want %d", tc.path, tc.body, got, tc.want)
		}
	}
}

// TestAdapterContextsAreItsWorkers': a request for a LoRA adapter may go
// only to the workers serving it, so its contexts are theirs: a prompt
// past every one of them is over (routed by load), where it was narrowed
// to the base model's longer workers, none of which may take it (a
// gateway 503, "all eligible workers were filtered").
func TestAdapterContextsAreItsWorkers(t *testing.T) {
	short := contextWorker(1, 4096)
	short.LoraAdapters = []string{"a"}
	router := routerWith(t, nil, short, contextWorker(2, 65536))
	c := newContextLimits(router.Catalog())
	part := selection.PartitionKey{Model: "m"}
	if over, fit := c.place(part, "a", 5000); !over || fit.allowed != nil {
		t.Errorf("past the adapter's one worker's context: over %v, allowed %v; want over", over, fit.allowed)
	}
	if over, fit := c.place(part, "", 5000); over || len(fit.allowed) != 1 || !fit.allowed[2] {
		t.Errorf("the base model: over %v, allowed %v; want worker 2", over, fit.allowed)
	}
	if over, fit := c.place(part, "a", 4000); over || fit.allowed != nil {
		t.Errorf("within the adapter's worker's context: over %v, allowed %v; want anywhere", over, fit.allowed)
	}
}

// TestContextsOutliveOtherModelsChanges: the figures are made again when
// a worker of their model changes, not when another model's does (every
// catalog change used to drop every partition's, and a fleet whose
// catalog changed a few thousand times a second made them on each
// request).
func TestContextsOutliveOtherModelsChanges(t *testing.T) {
	other := contextWorker(3, 4096)
	other.ModelName = ptr("n")
	router := routerWith(t, nil, contextWorker(1, 4096), contextWorker(2, 65536), other)
	c := newContextLimits(router.Catalog())
	part := selection.PartitionKey{Model: "m"}
	_, before := c.place(part, "", 5000)
	longer := uint64(8192)
	if _, err := router.Catalog().PatchWorker(3, &selection.WorkerRequest{MaxModelLen: &longer}); err != nil {
		t.Fatal(err)
	}
	// The same set, not one made again.
	if _, after := c.place(part, "", 5000); reflect.ValueOf(after.allowed).Pointer() != reflect.ValueOf(before.allowed).Pointer() {
		t.Error("after another model's change, the figures were made again")
	}
	if _, err := router.Catalog().PatchWorker(1, &selection.WorkerRequest{MaxModelLen: &longer}); err != nil {
		t.Fatal(err)
	}
	if over, fit := c.place(part, "", 5000); over || fit.allowed != nil {
		t.Errorf("worker 1's context grew to 8,192: over %v, allowed %v; want anywhere", over, fit.allowed)
	}
}

// BenchmarkContextPlaceChurn: BenchmarkContextPlace's request after each
// change to a worker of another model, as a catalog changing a few
// thousand times a second has it.
func BenchmarkContextPlaceChurn(b *testing.B) {
	var workers []selection.WorkerRequest
	for id := uint64(1); id <= 1024; id++ {
		workers = append(workers, contextWorker(id, 4096<<(id%2)))
	}
	other := contextWorker(2000, 4096)
	other.ModelName = ptr("n")
	router := routerWith(b, nil, append(workers, other)...)
	c := newContextLimits(router.Catalog())
	part := selection.PartitionKey{Model: "m"}
	lens := [2]uint64{4096, 8192}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if _, err := router.Catalog().PatchWorker(2000, &selection.WorkerRequest{MaxModelLen: &lens[i%2]}); err != nil {
			b.Fatal(err)
		}
		if _, fit := c.place(part, "", 5000); len(fit.allowed) != 512 {
			b.Fatal(len(fit.allowed))
		}
	}
}
