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
// load, unhashed, and predicted nothing; it is now routed by its ids. So
// is a batch of one such list, all floats or all strings, which pydantic
// reads as list[list[int]].
func TestLaxTokenIDsAreRoutedByPrefix(t *testing.T) {
	g := startGateway(t)
	startFleet(t, g, 2, true)
	for k, form := range []string{"%d.0", `"%d"`, "[%d.0]", `["%d"]`} {
		items := make([]string, 160)
		for i := range items {
			items[i] = fmt.Sprintf("%d", 1000+i)
		}
		// The last two forms are a batch of one (list[list[int]]), its
		// ids all floats or all strings: one prompt to vLLM.
		elem, batch := form, false
		if form[0] == '[' {
			elem, batch = form[1:len(form)-1], true
		}
		items[0] = fmt.Sprintf(elem, 3000+k) // a prompt of its own per form
		for i := 1; i < len(items); i++ {
			if batch || i%2 == 1 {
				items[i] = fmt.Sprintf(elem, 1000+i)
			}
		}
		prompt := "[" + strings.Join(items, ",") + "]"
		if batch {
			prompt = "[" + prompt + "]"
		}
		body := json.RawMessage(fmt.Sprintf(`{"model":%q,"max_tokens":2,"prompt":%s}`, model, prompt))
		sentTwice(t, g, form, body, 144)
	}
	if p := g.predictions(t, model); p.PromptTokensMismatch != 0 || p.CachedExact+p.NoCachedTokens != 8 {
		t.Fatalf("the gateway's accounting: %+v", p)
	}
}
