package caddymodule

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// TestLaxIDList reads prompts as vLLM's pydantic reads its prompt union:
// a list of strings only is a batch of text; any other flat list is
// list[int] in lax mode, or refused.
func TestLaxIDList(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want []uint32
	}{
		{`[7.0, 8.0, 9]`, []uint32{7, 8, 9}},
		{`[1e3,2E0,-0.0]`, []uint32{1000, 2, 0}},
		{`[7, "8", true, false]`, []uint32{7, 8, 1, 0}},
		{`[ "7" , 8.0 ]`, []uint32{7, 8}},
		{`["7", "8"]`, nil},     // strictly list[str]: a batch of two texts
		{`[7.5, 8]`, nil},       // not an integer: refused by the engine
		{`[-1.0]`, nil},         // not a token id
		{`[4294967296.0]`, nil}, // past uint32
		{`[7, "x"]`, nil},       // "x" is no int
		{`[7, null]`, nil},      // null is no int
		{`[[7.0], [8.0]]`, nil}, // a batch of lists
		{`[7, {"a": 1}]`, nil},  // an object
		{`[]`, nil},             // empty
		{`[7.0,"a\"]",8]`, nil}, // a string holding a bracket is still a string
	} {
		got, ok := laxIDList(selection.RawJSON(tc.raw))
		if ok != (tc.want != nil) || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v %v, want %v", tc.raw, got, ok, tc.want)
		}
	}
}

// TestLaxIDPromptsAreRoutedByTheirIDs: a prompt of ids written as floats
// is routed by its ids, where it went by load.
func TestLaxIDPromptsAreRoutedByTheirIDs(t *testing.T) {
	router := routerWith(t, nil)
	h := &Handler{router: router, contexts: newContextLimits(router.Catalog())}
	floats := "[" + strings.TrimSuffix(strings.Repeat("7.0,", 64), ",") + "]"
	toks, _ := routeOf(t, h, "/v1/completions", "m", `{"model":"m","prompt":`+floats+`}`)
	if len(toks) != 64 || toks[0] != 7 {
		t.Fatalf("64 ids as floats: routed by %d tokens", len(toks))
	}
}

// TestLaxIDListAllocatesOnce: a prompt of ids in lax forms costs one
// allocation, the ids at their size. Grown by append, and with a string
// made of each quoted or underscored element, 16 MiB of them cost 8 to 16
// times the body (256 MiB for floats).
func TestLaxIDListAllocatesOnce(t *testing.T) {
	for name, elem := range map[string]string{"floats": "1.0", "ints among floats": "1", "strings": `"12"`,
		"underscores": `"1_2"`, "spaced": `" 7 "`, "bools": "true", "escaped": `"\u0031\u0032"`} {
		raw := selection.RawJSON("[1.0," + strings.TrimSuffix(strings.Repeat(elem+",", 10_000), ",") + "]")
		allocs := testing.AllocsPerRun(5, func() {
			if ids, ok := laxIDList(raw); !ok || len(ids) != 10_001 {
				t.Fatalf("%s: %d ids, %v", name, len(ids), ok)
			}
		})
		// One, the ids; the count is the process's, and other goroutines
		// (the race detector's slower runs let more in) may add a few.
		if allocs > 16 {
			t.Errorf("%s: %.0f allocations for 10,001 ids, want 1", name, allocs)
		}
	}
}

// BenchmarkLaxIDList reads 16 MiB prompts of ids in lax forms, against
// the same ids as JSON integers through the request decoder (which every
// request pays).
func BenchmarkLaxIDList(b *testing.B) {
	for _, form := range []struct{ name, elem string }{{"floats", "123456.0"}, {"strings", `"12"`}, {"underscores", `"1_2"`}, {"escaped", `"\u0031\u0032"`}} {
		raw := selection.RawJSON("[1," + strings.TrimSuffix(strings.Repeat(form.elem+",", (16<<20)/(len(form.elem)+1)), ",") + "]")
		b.Run(form.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				if _, ok := laxIDList(raw); !ok {
					b.Fatal("not read")
				}
			}
		})
	}
	body := []byte(`{"model":"m","prompt":[1,` + strings.TrimSuffix(strings.Repeat("12,", (16<<20)/3), ",") + `]}`)
	b.Run("integers, decoded", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			var o openAIRequest
			if err := selection.DecodeJSON(body, &o); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestUnescapeShortAsJSON: a short string's escapes decode as Go's JSON
// decoder decodes them (lone surrogates to U+FFFD included); one that
// does not fit the buffer is left to it.
func TestUnescapeShortAsJSON(t *testing.T) {
	for _, in := range []string{`"12"`, `"\u0031\u0032"`, `"\u00a07\u00A0"`, `"\t7\n"`, `"\/\"\\"`, `"\b\f\r"`,
		`"\ud83d\ude00"`, `"\ud83d"`, `"\ude00x"`, `"\ud83d\u0041"`, `"é\u00e9"`, `""`} {
		var want string
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		var buf [64]byte
		got, ok := unescapeShort([]byte(in), buf[:])
		if !ok || string(got) != want {
			t.Errorf("%s: %q %v, want %q", in, got, ok, want)
		}
	}
	long := `"` + strings.Repeat(`\u0030`, 30) + `"`
	var buf [16]byte
	if _, ok := unescapeShort([]byte(long), buf[:]); ok {
		t.Error("a text longer than the buffer was decoded into it")
	}
}
