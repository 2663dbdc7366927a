package fidelity

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// A prompt of token ids written as floats (what a numpy array's tolist()
// gives), or with a number as a string among them, is a list[int] to
// vLLM's pydantic: prefilled as the same ids. The gateway routed it by
// load, unhashed, and predicted nothing; it is now routed by its ids.
func TestLaxTokenIDsAreRoutedByPrefix(t *testing.T) {
	g := startGateway(t)
	startFleet(t, g, 2, true)
	for k, form := range []string{"%d.0", `"%d"`} {
		items := make([]string, 160)
		for i := range items {
			items[i] = fmt.Sprintf("%d", 1000+i)
		}
		items[0] = fmt.Sprintf(form, 3000+k) // a prompt of its own per form
		for i := 1; i < len(items); i += 2 {
			items[i] = fmt.Sprintf(form, 1000+i)
		}
		body := json.RawMessage(fmt.Sprintf(`{"model":%q,"max_tokens":2,"prompt":[%s]}`, model, strings.Join(items, ",")))
		sentTwice(t, g, form, body, 144)
	}
	if p := g.predictions(t, model); p.PromptTokensMismatch != 0 || p.CachedExact+p.NoCachedTokens != 4 {
		t.Fatalf("the gateway's accounting: %+v", p)
	}
}
