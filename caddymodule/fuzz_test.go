package caddymodule

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// FuzzOpenAIBody checks the proxy path's body reader: a body it accepts
// is one encoding/json accepts, with the same model and, for an
// integer-array prompt or token_ids, the same token ids, each read under
// its exact name (as the engine reads them: "MODEL" is not the model).
func FuzzOpenAIBody(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","prompt":[1,2,3]}`, `{"model":"m","prompt":"hello"}`, `{"model":"m","prompt":[[1],[2]]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, `{"token_ids":[5],"prompt":[6]}`,
		`{"prompt":["a"],"stream":true}`, `{"prompt":[1,-1]}`, `{"prompt":`, `null`,
		`{"model":"a","MODEL":"b","Prompt":[1],"prompt":[2],"TOKEN_IDS":[3]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var o openAIRequest
		if err := selection.DecodeJSON(body, &o); err != nil {
			if s := selection.StatusOf(err); s != 400 && s != 422 {
				t.Fatalf("status %d for %q", s, body)
			}
			return
		}
		var members map[string]json.RawMessage // exact names; the last of a repeated one
		if err := json.Unmarshal(body, &members); err != nil {
			t.Fatalf("accepted a body encoding/json rejects (%v): %q", err, body)
		}
		var ref struct {
			Model    string
			Prompt   json.RawMessage
			TokenIDs []uint32
		}
		for name, dst := range map[string]any{"model": &ref.Model, "token_ids": &ref.TokenIDs} {
			if raw, ok := members[name]; ok {
				if err := json.Unmarshal(raw, dst); err != nil {
					t.Fatalf("accepted a %s encoding/json rejects (%v): %q", name, err, body)
				}
			}
		}
		ref.Prompt = members["prompt"]
		if o.Model != ref.Model || !slices.Equal(o.TokenIDs, ref.TokenIDs) {
			t.Fatalf("model %q tokens %v; encoding/json %q %v", o.Model, o.TokenIDs, ref.Model, ref.TokenIDs)
		}
		if o.promptTokens != nil {
			var toks []uint32
			if err := json.Unmarshal(ref.Prompt, &toks); err != nil || !slices.Equal(toks, o.promptTokens) {
				t.Fatalf("prompt tokens %v; encoding/json %v (%v)", o.promptTokens, toks, err)
			}
		}
	})
}

// FuzzCaddyfile parses arbitrary kv_router global options and kv_router
// handler blocks: no panic, and what parses survives a JSON round trip.
func FuzzCaddyfile(f *testing.F) {
	for _, seed := range []string{
		"kv_router {\n block_size 16\n use_kv_events off\n worker 1 {\n endpoint a:1\n kv_events tcp://a:2\n }\n}",
		"kv_router {\n router_temperature 0.5\n session_affinity_ttl 1m\n index_max_entries 100\n}",
		"kv_router {\n explain on\n tokenize_timeout 1s\n max_body_size 1MiB\n}",
		"kv_router {\n worker x {\n }\n}", "kv_router {\n block_size -1\n}", "kv_router {",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, input string) {
		// Caddy's NewTestDispenser exits the process on input its lexer
		// refuses (a bad heredoc, say); Caddy itself reports that as an
		// error before any module sees a token, and so does this.
		tokens, err := caddyfile.Tokenize([]byte(input), "Caddyfile")
		if err != nil {
			return
		}
		for _, v := range []caddyfile.Unmarshaler{new(App), new(Handler), new(Policy)} {
			if err := v.UnmarshalCaddyfile(caddyfile.NewDispenser(slices.Clone(tokens))); err != nil {
				continue
			}
			b, err := json.Marshal(v)
			if err != nil {
				t.Fatalf("%T: marshal: %v", v, err)
			}
			back := reflect.New(reflect.TypeOf(v).Elem()).Interface()
			if err := json.Unmarshal(b, back); err != nil {
				t.Fatalf("%T: %s does not unmarshal: %v", v, b, err)
			}
			b2, _ := json.Marshal(back)
			if string(b) != string(b2) {
				t.Fatalf("%T: round trip %s -> %s", v, b, b2)
			}
		}
	})
}
