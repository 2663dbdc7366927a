package selection

import (
	stdjson "encoding/json"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestDecodeTokenIDs(t *testing.T) {
	tests := []struct {
		body   string
		tokens []uint32 // nil: absent
		model  string
	}{
		{`{"token_ids":[1,2,3],"model_name":"m"}`, []uint32{1, 2, 3}, "m"},
		{`{"model_name":"m", "token_ids" : [ 0 , 4294967295 ] }`, []uint32{0, 4294967295}, "m"},
		{` {"token_ids":[]}`, []uint32{}, ""},
		{`{"token_ids":null,"model_name":"x"}`, nil, "x"},
		{`{"model_name":"a","TOKEN_IDS":[7]}`, []uint32{7}, "a"},
		{`{"model_name":"a"}`, nil, "a"},
		{"{\n\"token_ids\":[5,\n6],\"model_name\":\"q\"\n}", []uint32{5, 6}, "q"},
		{`{"routing_group":"g","token_ids":[9],"model_name":"m","session_id":"s"}`, []uint32{9}, "m"},
	}
	for i, tc := range tests {
		var req SelectRequest
		if err := DecodeJSON([]byte(tc.body), &req); err != nil {
			t.Errorf("Test %d: %v", i, err)
			continue
		}
		if (tc.tokens == nil) != (req.TokenIDs == nil) || !slices.Equal(tc.tokens, req.TokenIDs) {
			t.Errorf("Test %d: tokens %v, want %v", i, req.TokenIDs, tc.tokens)
		}
		if req.ModelName != tc.model {
			t.Errorf("Test %d: model %q, want %q", i, req.ModelName, tc.model)
		}
	}
}

func TestDecodeRejections(t *testing.T) {
	tests := []struct {
		body   string
		kind   Kind
		substr string
	}{
		{`{"token_ids":[1,-2]}`, KindUnprocessable, "token_ids[1]: invalid value: integer `-2`"},
		{`{"token_ids":[1.5]}`, KindUnprocessable, "token_ids[0]: invalid type: floating point"},
		{`{"token_ids":[1e3]}`, KindUnprocessable, "token_ids[0]: invalid type: floating point"},
		{`{"token_ids":[4294967296]}`, KindUnprocessable, "token_ids[0]: invalid value: integer `4294967296`"},
		{`{"token_ids":[1,2,99999999999999999999]}`, KindUnprocessable, "token_ids[2]"},
		{`{"token_ids":["1"]}`, KindUnprocessable, "token_ids[0]: invalid type: string"},
		{`{"token_ids":[true]}`, KindUnprocessable, "token_ids[0]: invalid type: true"},
		{`{"token_ids":[1,null]}`, KindUnprocessable, "token_ids[1]: invalid type: null"},
		{`{"token_ids":[[1]]}`, KindUnprocessable, "token_ids[0]: invalid type: sequence"},
		{`{"token_ids":"abc"}`, KindUnprocessable, "token_ids: invalid type: string"},
		{`{"token_ids":[1,2],"token_ids":[3]}`, KindUnprocessable, "duplicate field"},
		{`{"is_eagle":"false"}`, KindUnprocessable, "is_eagle: invalid type: string, expected a boolean"},
		{`{"model_name":5}`, KindUnprocessable, "model_name: invalid type: number, expected a string"},
		{`{"isl_tokens":-1}`, KindUnprocessable, ""},
		{`{"token_ids":[01]}`, KindMalformed, ""},
		{`{"token_ids":[1,]}`, KindMalformed, ""},
		{`{"token_ids":[1 2]}`, KindMalformed, ""},
		{`{"token_ids":[1`, KindMalformed, ""},
		{`{"token_ids":[1.]}`, KindMalformed, ""},
		{`{"token_ids":[-]}`, KindMalformed, ""},
		{`{"model_name":"a",}`, KindMalformed, ""},
		{`{"model_name":"a"} x`, KindMalformed, "trailing"},
		{`{"model_name":"a`, KindMalformed, ""},
		{`not json`, KindMalformed, ""},
		{``, KindMalformed, ""},
		{`[1,2]`, KindUnprocessable, "invalid type: array, expected a map"},
		{`{"a":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`, KindMalformed, "recursion"},
		{`{"block_hashes":[1,"x"]}`, KindUnprocessable, ""},
		{`{"block_hashes":[18446744073709551616]}`, KindUnprocessable, "[0]"},
		{`{"mm_routing_info":{"routing_token_ids":[1,-1]}}`, KindUnprocessable, "routing_token_ids[1]"},
	}
	for i, tc := range tests {
		var req SelectRequest
		err := DecodeJSON([]byte(tc.body), &req)
		e, ok := err.(*Error)
		if !ok {
			t.Errorf("Test %d (%s): error %v (%T), want kind %d", i, tc.body, err, err, tc.kind)
			continue
		}
		if e.Kind != tc.kind || !strings.Contains(e.Msg, tc.substr) {
			t.Errorf("Test %d (%s): got kind %d %q, want kind %d containing %q", i, tc.body, e.Kind, e.Msg, tc.kind, tc.substr)
		}
		wantPrefix := shapePrefix
		if tc.kind == KindMalformed {
			wantPrefix = syntaxPrefix
		}
		if !strings.HasPrefix(e.Msg, wantPrefix) {
			t.Errorf("Test %d: message %q lacks prefix %q", i, e.Msg, wantPrefix)
		}
		if strings.Contains(e.Msg, "Go ") || strings.Contains(e.Msg, "selection.") {
			t.Errorf("Test %d: message %q names the gateway's Go types", i, e.Msg)
		}
	}
}

// TestDecodeMatchesEncodingJSON decodes the same bodies with encoding/json
// into an equivalent struct whose token_ids is a plain []uint32, and checks
// both agree on every field.
func TestDecodeMatchesEncodingJSON(t *testing.T) {
	type ref struct {
		ModelName      string   `json:"model_name"`
		RoutingGroup   string   `json:"routing_group"`
		TokenIDs       []uint32 `json:"token_ids"`
		BlockHashes    []int64  `json:"block_hashes"`
		LoraName       string   `json:"lora_name"`
		CacheSalt      string   `json:"cache_salt"`
		IsEagle        *bool    `json:"is_eagle"`
		SelectionID    string   `json:"selection_id"`
		AllowedWorkers []uint64 `json:"allowed_worker_ids"`
	}
	bodies := []string{
		`{"model_name":"m","token_ids":[1,2,3,4,5],"lora_name":"l","is_eagle":true}`,
		`{"token_ids":[0],"routing_group":"g","cache_salt":"s\"q","selection_id":"id-1"}`,
		`{"block_hashes":[-1,2,9223372036854775807],"allowed_worker_ids":[3,4],"is_eagle":null}`,
		`{"selection_id":"x","token_ids":[]}`,
		`{"model_name":"é\u00e9","unknown":{"a":[1,{"b":null}]},"token_ids":[42]}`,
	}
	for i, body := range bodies {
		var want ref
		if err := stdjson.Unmarshal([]byte(body), &want); err != nil {
			t.Fatal(err)
		}
		var got SelectRequest
		if err := DecodeJSON([]byte(body), &got); err != nil {
			t.Fatalf("Test %d: %v", i, err)
		}
		hashes := make([]int64, len(got.BlockHashes))
		for k, h := range got.BlockHashes {
			hashes[k] = int64(h)
		}
		if got.ModelName != want.ModelName || got.RoutingGroup != want.RoutingGroup || got.LoraName != want.LoraName ||
			got.CacheSalt != want.CacheSalt || got.SelectionID != want.SelectionID ||
			!slices.Equal(got.TokenIDs, want.TokenIDs) || (got.TokenIDs == nil) != (want.TokenIDs == nil) ||
			!slices.Equal(hashes, want.BlockHashes) || !slices.Equal(got.AllowedWorkerIDs, want.AllowedWorkers) ||
			(got.IsEagle == nil) != (want.IsEagle == nil) || got.IsEagle != nil && *got.IsEagle != *want.IsEagle {
			t.Errorf("Test %d: got %+v, want %+v", i, got, want)
		}
	}
}

func TestDecodeReusesTokenBuffer(t *testing.T) {
	body := []byte(`{"token_ids":[1,2,3,4,5,6,7,8]}`)
	var req SelectRequest
	if err := DecodeJSON(body, &req); err != nil {
		t.Fatal(err)
	}
	first := &req.TokenIDs[:1][0]
	allocs := testing.AllocsPerRun(100, func() {
		if err := DecodeJSON(body, &req); err != nil {
			t.Fatal(err)
		}
	})
	if &req.TokenIDs[:1][0] != first {
		t.Fatal("token buffer was not reused")
	}
	if allocs > 8 {
		t.Fatalf("%v allocations per decode, want at most 8", allocs)
	}
}

func TestHashesRoundTrip(t *testing.T) {
	var h Hashes
	if err := h.UnmarshalJSON([]byte(`[-1, 18446744073709551615, 0, 5]`)); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(h, Hashes{^uint64(0), ^uint64(0), 0, 5}) {
		t.Fatalf("got %v", h)
	}
	out, _ := h.MarshalJSON()
	if string(out) != "[-1,-1,0,5]" {
		t.Fatalf("marshal %s", out)
	}
}

// TestDecodeRandomTokenArrays compares the token decoder with encoding/json
// on random arrays: every digit count up to 10, values near 2^32, random
// spacing, and array ends at every offset modulo the eight-byte fast path.
func TestDecodeRandomTokenArrays(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	spaces := []string{"", "", "", " ", "\n", " \t "}
	for iter := range 3000 {
		n := rng.IntN(40)
		var sb strings.Builder
		sb.WriteString(`{"a":1,"token_ids":[`)
		for i := range n {
			if i > 0 {
				sb.WriteString(spaces[rng.IntN(len(spaces))] + "," + spaces[rng.IntN(len(spaces))])
			}
			var v uint64
			switch rng.IntN(4) {
			case 0:
				v = uint64(rng.IntN(10))
			case 1:
				v = uint64(rng.IntN(150000))
			case 2:
				v = rng.Uint64N(1 << 32)
			default:
				v = (1 << 32) - 1 - uint64(rng.IntN(3))
			}
			sb.WriteString(strconv.FormatUint(v, 10))
		}
		sb.WriteString(`]` + strings.Repeat(" ", rng.IntN(9)) + `}`)
		body := sb.String()
		var want struct {
			TokenIDs []uint32 `json:"token_ids"`
		}
		if err := stdjson.Unmarshal([]byte(body), &want); err != nil {
			t.Fatalf("iter %d: reference rejected %q: %v", iter, body, err)
		}
		var got SelectRequest
		if err := DecodeJSON([]byte(body), &got); err != nil {
			t.Fatalf("iter %d: %q: %v", iter, body, err)
		}
		if !slices.Equal(got.TokenIDs, want.TokenIDs) {
			t.Fatalf("iter %d: %q: got %v, want %v", iter, body, got.TokenIDs, want.TokenIDs)
		}
		// Out of range by one, at a random index: 422 naming that index.
		if n > 0 {
			k := rng.IntN(n)
			toks := make([]string, n)
			for i, v := range want.TokenIDs {
				toks[i] = strconv.FormatUint(uint64(v), 10)
			}
			toks[k] = "4294967296"
			var req SelectRequest
			err := DecodeJSON([]byte(`{"token_ids":[`+strings.Join(toks, ",")+`]}`), &req)
			if e, ok := err.(*Error); !ok || e.Kind != KindUnprocessable || !strings.Contains(e.Msg, "token_ids["+strconv.Itoa(k)+"]") {
				t.Fatalf("iter %d: out-of-range at %d: %v", iter, k, err)
			}
		}
	}
}

type completionBody struct {
	Prompt
	Model     string  `json:"model"`
	RawPrompt RawJSON `json:"prompt"`
	toks      []uint32
}

func (c *completionBody) PromptTokens() *[]uint32 { return &c.toks }

func TestDecodeIntegerPrompt(t *testing.T) {
	tests := []struct {
		body   string
		toks   []uint32 // the prompt's token ids, nil if it was not an integer array
		raw    string   // what the generic decoder kept of prompt
		tokens []uint32 // token_ids
	}{
		{`{"model":"m","prompt":[1,2,3]}`, []uint32{1, 2, 3}, "", nil},
		{`{"prompt":"hello","model":"m"}`, nil, `"hello"`, nil},
		{`{"prompt":["a","b"],"model":"m"}`, nil, `["a","b"]`, nil},
		{`{"prompt":[[1,2],[3]],"model":"m"}`, nil, `[[1,2],[3]]`, nil},
		{`{"token_ids":[9],"model":"m","prompt":[4, 5]}`, []uint32{4, 5}, "", []uint32{9}},
		{`{"prompt":[7],"token_ids":[8]}`, []uint32{7}, "", []uint32{8}},
		// Repeated, the last prompt is the engine's (Python's json).
		{`{"model":"m","prompt":[1,2,3],"prompt":[4,5]}`, []uint32{4, 5}, "", nil},
		{`{"model":"m","prompt":[1,2,3],"prompt":"text"}`, nil, `"text"`, nil},
		{`{"model":"m","prompt":"text","prompt":[6]}`, []uint32{6}, `"text"`, nil},
	}
	for i, tc := range tests {
		var c completionBody
		if err := DecodeJSON([]byte(tc.body), &c); err != nil {
			t.Fatalf("Test %d: %v", i, err)
		}
		if !slices.Equal(c.toks, tc.toks) || (c.toks == nil) != (tc.toks == nil) || string(c.RawPrompt) != tc.raw ||
			!slices.Equal(c.TokenIDs, tc.tokens) || c.Model != "m" && strings.Contains(tc.body, `"model"`) {
			t.Errorf("Test %d: toks %v raw %q tokens %v model %q", i, c.toks, c.RawPrompt, c.TokenIDs, c.Model)
		}
	}
	// A reused value: a text prompt after an integer one leaves no tokens.
	var reused completionBody
	if err := DecodeJSON([]byte(`{"prompt":[1,2]}`), &reused); err != nil || len(reused.toks) != 2 {
		t.Fatal(err)
	}
	reused.toks = reused.toks[:0]
	if err := DecodeJSON([]byte(`{"prompt":"text"}`), &reused); err != nil || reused.toks != nil {
		t.Fatalf("text prompt after a reused buffer: %v %v", reused.toks, err)
	}
	// A broken prompt array is a syntax error, not a silent fallback.
	var c completionBody
	if err := DecodeJSON([]byte(`{"prompt":[1,}`), &c); err == nil || err.(*Error).Kind != KindMalformed {
		t.Fatalf("broken prompt: %v", err)
	}
}

// generateBody takes both prompt and SGLang's input_ids as token arrays.
type generateBody struct {
	completionBody
	RawInputIDs RawJSON `json:"input_ids"`
	ids         []uint32
}

func (g *generateBody) InputIDs() *[]uint32 { return &g.ids }

// TestDecodeInputIDs: input_ids goes to its own carrier when it is an
// integer array, and to the generic decoder when it is a batch; prompt
// goes where it always did, and neither takes the other's place.
func TestDecodeInputIDs(t *testing.T) {
	tests := []struct {
		body      string
		ids, toks []uint32
		raw       string
	}{
		{`{"input_ids":[1,2,3]}`, []uint32{1, 2, 3}, nil, ""},
		{`{"input_ids":[[1,2],[3]]}`, nil, nil, `[[1,2],[3]]`},
		{`{"prompt":[4],"input_ids":[5,6]}`, []uint32{5, 6}, []uint32{4}, ""},
		{`{"text":"hi"}`, nil, nil, ""},
	}
	for i, tc := range tests {
		var g generateBody
		g.ids = []uint32{99} // a reused buffer's leftovers
		if err := DecodeJSON([]byte(tc.body), &g); err != nil {
			t.Fatalf("Test %d: %v", i, err)
		}
		if !slices.Equal(g.ids, tc.ids) || (g.ids == nil) != (tc.ids == nil) || !slices.Equal(g.toks, tc.toks) || string(g.RawInputIDs) != tc.raw {
			t.Errorf("Test %d: input_ids %v prompt %v raw %q", i, g.ids, g.toks, g.RawInputIDs)
		}
	}
}
