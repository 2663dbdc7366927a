package selection

import (
	"slices"
	"strings"
	"testing"
)

// engineBody is a completions body read as an engine reads it: members
// under their exact names only.
type engineBody struct{ completionBody }

func (*engineBody) ExactNames() {}

// TestDecodeExactNames: under ExactNames a member whose name matches a
// field's only with case folded is left out, wherever it stands among
// the others, token_ids and an integer prompt included; without it, such
// a member is taken, as the selection API documents.
func TestDecodeExactNames(t *testing.T) {
	tests := []struct {
		body   string
		model  string
		toks   []uint32 // the integer prompt
		tokens []uint32 // token_ids
		salt   string
	}{
		{`{"model":"a","MODEL":"b"}`, "a", nil, nil, ""},
		{`{"MODEL":"b","model":"a"}`, "a", nil, nil, ""},
		{`{"MODEL":"b"}`, "", nil, nil, ""},
		{`{"Model":"b","MODEL":"c","model":"a","mOdEl":"d"}`, "a", nil, nil, ""},
		{`{"TOKEN_IDS":[1],"token_ids":[2],"PROMPT":[3],"prompt":[4],"model":"a"}`, "a", []uint32{4}, []uint32{2}, ""},
		{`{"prompt":[4],"Prompt":[3],"Token_Ids":[1]}`, "", []uint32{4}, nil, ""},
		{`{"cache_salt":"s","CACHE_SALT":"t"}`, "", nil, nil, "s"},
		{` { "MODEL" : "b" , "model" : "a" , "Cache_Salt" : {"x":[1,2]} } `, "a", nil, nil, ""},
		{`{"mod\u0045l":"b","model":"a"}`, "a", nil, nil, ""},
		{`{"temperature":0.5,"model":"a","TEMPERATURE":1}`, "a", nil, nil, ""},
	}
	for i, tc := range tests {
		var e engineBody
		if err := DecodeJSON([]byte(tc.body), &e); err != nil {
			t.Fatalf("Test %d (%s): %v", i, tc.body, err)
		}
		if e.Model != tc.model || !slices.Equal(e.toks, tc.toks) || !slices.Equal(e.TokenIDs, tc.tokens) || e.CacheSalt != tc.salt {
			t.Errorf("Test %d (%s): model %q prompt %v token_ids %v salt %q", i, tc.body, e.Model, e.toks, e.TokenIDs, e.CacheSalt)
		}
	}
	// Without ExactNames, the case-folded name is taken.
	var c completionBody
	if err := DecodeJSON([]byte(`{"MODEL":"b"}`), &c); err != nil || c.Model != "b" {
		t.Fatalf("the selection API's reading: model %q, %v", c.Model, err)
	}
	// Many such members, with a large token array between them: each is
	// stepped over once.
	var b strings.Builder
	b.WriteString(`{"model":"a","MODEL":"x","token_ids":[`)
	b.WriteString(strings.Repeat("7,", 99) + "7]")
	for range 1000 {
		b.WriteString(`,"MODEL":"x"`)
	}
	b.WriteString(`}`)
	var many engineBody
	if err := DecodeJSON([]byte(b.String()), &many); err != nil || many.Model != "a" || len(many.TokenIDs) != 100 {
		t.Fatalf("1,000 folded names: model %q, %d token ids, %v", many.Model, len(many.TokenIDs), err)
	}
}
