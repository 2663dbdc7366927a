package caddymodule

import (
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// idList is n token ids as a JSON list.
func idList(n int) string {
	return "[" + strings.TrimSuffix(strings.Repeat("7,", n), ",") + "]"
}

// TestLongestIDList counts the longest list of a batch without decoding
// it; strings, however they are escaped, are not lists, and a list that
// holds anything but numbers is counted byte by byte.
func TestLongestIDList(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want int
		ok   bool
	}{
		{`[[1,2,3],[4,5]]`, 3, true},
		{`[ [ 1 , 2 ] , [ ] ]`, 2, true},
		{`[[],[]]`, 0, true},
		{`["a,b,c", [1]]`, 1, true},
		{`["a\"],[1,2,3,4", [1,2]]`, 2, true},
		{`["x","y"]`, 0, false},
		{`[{"a":[1,2,3]},[9]]`, 1, true},
		{`[]`, 0, false},
		{`[[1,"]",3],[4]]`, 3, true},
		{`[[1,[2,3],4],[5]]`, 3, true},
		{"[[1,\n2\t,3]]", 3, true},
	} {
		got, ok := longestIDList(selection.RawJSON(tc.raw))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: %d %v, want %d %v", tc.raw, got, ok, tc.want, tc.ok)
		}
	}
}

// TestLongestIDListReadsEachByteAFewTimes: the byte searches read each
// byte of a batch a bounded number of times, whatever its elements. A
// search from each object of a batch went on to the batch's end: 1 MiB
// of {} read the rest of the body once an element, 5 s of the gateway's
// CPU, quadratic in the body.
func TestLongestIDListReadsEachByteAFewTimes(t *testing.T) {
	for name, elem := range map[string]string{"objects": `{}`, "objects of ids": `{"a":[1,2]}`, "ids": `[1,2,3]`,
		"strings": `"x"`, "lists of strings": `["x","y"]`, "nested": `[[1],[2]]`, "mixed": `[1,"]",{}]`} {
		raw := "[" + strings.TrimSuffix(strings.Repeat(elem+",", (64<<10)/len(elem)), ",") + "]"
		_, _, searched := scanIDLists(selection.RawJSON(raw))
		if searched > 5*len(raw) {
			t.Errorf("%s: the searches read %d bytes of a %d-byte batch (%.0f times)", name, searched, len(raw), float64(searched)/float64(len(raw)))
		}
	}
}

// routeOf runs what the handler routes body by, on path, for model's
// partition: the tokens (nil: by load) and the workers allowed.
func routeOf(t *testing.T, h *Handler, path, model, body string) ([]uint32, []uint64) {
	t.Helper()
	var o openAIRequest
	if err := selection.DecodeJSON([]byte(body), &o); err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, path, nil)
	part := selection.Partition{ModelName: model}
	toks, fit := h.routingTokens(r, &o, part.Key(), "")
	if fit.allowed == nil {
		return toks, nil
	}
	ids := slices.Collect(maps.Keys(fit.allowed))
	slices.Sort(ids)
	return toks, ids
}

// TestLoadRoutedIDPromptsGoWhereTheyFit: a request routed by load whose
// prompt is token ids (its logprobs asked for, so no cache is read; a
// batch of prompts; an SGLang extra_key) still cannot be served by a
// worker whose context its prompt overruns: it goes to those it fits,
// by its longest prompt (helper-53's probe: a 400 from the short worker).
// One that fits none is counted over and goes anywhere.
func TestLoadRoutedIDPromptsGoWhereTheyFit(t *testing.T) {
	router := routerWith(t, nil, contextWorker(1, 100), contextWorker(2, 1000))
	h := &Handler{router: router, contexts: newContextLimits(router.Catalog())}
	long, short := idList(500), idList(3)
	for _, tc := range []struct {
		what, path, body string
		want             []uint64
	}{
		{"prompt_logprobs", "/v1/completions", `{"model":"m","prompt_logprobs":1,"prompt":` + long + `}`, []uint64{2}},
		{"echo with logprobs", "/v1/completions", `{"model":"m","echo":true,"logprobs":1,"prompt":` + long + `}`, []uint64{2}},
		{"a batch, the long prompt second", "/v1/completions", `{"model":"m","prompt":[` + short + `,` + long + `]}`, []uint64{2}},
		{"a batch with text", "/v1/completions", `{"model":"m","prompt":["some text",` + long + `]}`, []uint64{2}},
		{"a batch cut to fit", "/v1/completions", `{"model":"m","truncate_prompt_tokens":50,"prompt":[` + short + `,` + long + `]}`, nil},
		{"a batch of short prompts", "/v1/completions", `{"model":"m","prompt":[` + short + `,` + short + `]}`, nil},
		{"a batch of text", "/v1/completions", `{"model":"m","prompt":["a","b"]}`, nil},
		{"an SGLang extra_key", "/v1/completions", `{"model":"m","extra_key":"k","prompt":` + long + `}`, []uint64{2}},
		{"SGLang's batch of input_ids", "/generate", `{"input_ids":[` + short + `,` + long + `]}`, []uint64{2}},
		{"SGLang's input_ids, return_logprob from 0", "/generate", `{"return_logprob":true,"logprob_start_len":0,"input_ids":` + long + `}`, []uint64{2}},
		{"a chat's token_ids with prompt_logprobs", "/v1/chat/completions", `{"model":"m","prompt_logprobs":0,"messages":[],"token_ids":` + long + `}`, []uint64{2}},
	} {
		toks, allowed := routeOf(t, h, tc.path, "m", tc.body)
		if toks != nil || !slices.Equal(allowed, tc.want) {
			t.Errorf("%s: routed by %d tokens, allowed %v; want by load, allowed %v", tc.what, len(toks), allowed, tc.want)
		}
	}
	over := contextFiltered.WithLabelValues("m", "over")
	o0 := testCounter(over)
	toks, allowed := routeOf(t, h, "/v1/completions", "m", `{"model":"m","prompt":[`+short+`,`+idList(2000)+`]}`)
	if toks != nil || allowed != nil || testCounter(over)-o0 != 1 {
		t.Errorf("a batch past every context: %d tokens, allowed %v, %v counted over; want by load, anywhere, 1",
			len(toks), allowed, testCounter(over)-o0)
	}
}

// BenchmarkLongestIDList: counting a 16 MiB batch of two prompts of ids
// (some 2.8 million), against decoding the request that holds it, which
// every request pays.
func BenchmarkLongestIDList(b *testing.B) {
	half := idList(1 << 20)
	half = strings.ReplaceAll(half, "7", "123456") // six-digit ids, as a real vocabulary's
	body := []byte(`{"model":"m","prompt":[` + half + `,` + half + `]}`)
	b.Run("decode", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			var o openAIRequest
			if err := selection.DecodeJSON(body, &o); err != nil {
				b.Fatal(err)
			}
		}
	})
	var o openAIRequest
	if err := selection.DecodeJSON(body, &o); err != nil {
		b.Fatal(err)
	}
	b.Run("count", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if n, ok := longestIDList(o.RawPrompt); !ok || n != 1<<20 {
				b.Fatal(n, ok)
			}
		}
	})
}

// BenchmarkLongestIDListObjects counts a 256 KiB batch of {} elements
// (each object's search once ran to the batch's end) against a batch of
// lists of the same size.
func BenchmarkLongestIDListObjects(b *testing.B) {
	for _, form := range []struct{ name, elem string }{{"objects", "{}"}, {"lists", "[1]"}} {
		raw := selection.RawJSON("[" + strings.TrimSuffix(strings.Repeat(form.elem+",", (256<<10)/(len(form.elem)+1)), ",") + "]")
		b.Run(form.name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				longestIDList(raw)
			}
		})
	}
}
