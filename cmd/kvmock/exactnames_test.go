package main

import (
	"encoding/json"
	"net/http"
	"testing"
)

// TestMembersMatchByExactName: as vLLM's request models, kvmock reads a
// member under its exact name only: a "MODEL" is not the model, a
// "PROMPT" not the prompt, wherever they stand.
func TestMembersMatchByExactName(t *testing.T) {
	f := newTestFleet(t, nil)
	model := f.cfg.Model
	res, b := postJSON(t, f.url(1)+"/v1/completions", `{"model":"no-such-model","MODEL":"`+model+`","prompt":[1,2,3]}`)
	if res.StatusCode != http.StatusNotFound {
		t.Fatalf(`"model" unserved and "MODEL" served: %d %s; want vLLM's 404`, res.StatusCode, b)
	}
	for _, body := range []string{
		`{"model":"` + model + `","PROMPT":[9,9,9,9,9,9],"prompt":[1,2,3],"max_tokens":1}`,
		`{"prompt":[1,2,3],"Prompt":[9,9,9,9,9,9],"Model":"no-such-model","max_tokens":1}`,
	} {
		res, b := postJSON(t, f.url(1)+"/v1/completions", body)
		var c completion
		if res.StatusCode != http.StatusOK || json.Unmarshal(b, &c) != nil || c.Usage == nil || c.Usage.PromptTokens != 3 {
			t.Fatalf("%s: %d %s; want the 3-token prompt served", body, res.StatusCode, b)
		}
	}
}
