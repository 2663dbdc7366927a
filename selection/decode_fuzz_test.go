package selection

import (
	stdjson "encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

// FuzzDecodeJSON checks the request decoder against encoding/json: a body
// it accepts must be one encoding/json accepts too, with the same token
// ids and partition; a body it rejects gets a 400 or 422 with axum's text.
func FuzzDecodeJSON(f *testing.F) {
	for _, seed := range []string{
		`{"token_ids":[1,2,3],"model_name":"m"}`,
		`{"model_name":"m","token_ids":[0,4294967295],"routing_group":"g"}`,
		`{"token_ids":[1,-2]}`, `{"token_ids":[1.5]}`, `{"token_ids":"x"}`, `{"token_ids":null}`,
		`{"block_hashes":[-1,18446744073709551615],"sequence_hashes":[1],"isl_tokens":4}`,
		`{"is_eagle":"false"}`, `{"token_ids":[1,2],"token_ids":[3]}`, `[1]`, `{`, ``,
		`{"a":[[[[{}]]]],"token_ids":[ 5 , 6 ]}`, `{"TOKEN_IDS":[7]}`, `{"token_ids":[01]}`,
		`{"router_config_override":{"prefill_load_scale":1e309}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var got SelectRequest
		err := DecodeJSON(body, &got)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v is not an *Error", err)
			}
			switch e.Kind {
			case KindMalformed:
				if !strings.HasPrefix(e.Msg, syntaxPrefix) {
					t.Fatalf("400 without the syntax prefix: %q", e.Msg)
				}
			case KindUnprocessable:
				if !strings.HasPrefix(e.Msg, shapePrefix) {
					t.Fatalf("422 without the shape prefix: %q", e.Msg)
				}
			default:
				t.Fatalf("decode error of kind %d: %q", e.Kind, e.Msg)
			}
			return
		}
		var ref struct {
			ModelName    string   `json:"model_name"`
			RoutingGroup string   `json:"routing_group"`
			TokenIDs     []uint32 `json:"token_ids"`
		}
		if rerr := stdjson.Unmarshal(body, &ref); rerr != nil {
			// encoding/json is laxer on some inputs (invalid UTF-8 in
			// strings) and stricter on none that we accept.
			t.Fatalf("accepted a body encoding/json rejects (%v): %q", rerr, body)
		}
		if !slices.Equal(got.TokenIDs, ref.TokenIDs) || (got.TokenIDs == nil) != (ref.TokenIDs == nil) {
			t.Fatalf("tokens %v, encoding/json %v", got.TokenIDs, ref.TokenIDs)
		}
		if got.ModelName != ref.ModelName || got.RoutingGroup != ref.RoutingGroup {
			t.Fatalf("partition %q/%q, encoding/json %q/%q", got.ModelName, got.RoutingGroup, ref.ModelName, ref.RoutingGroup)
		}
	})
}
