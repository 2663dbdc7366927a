package indexer

import (
	"strings"
	"testing"
)

// A bind-mode publisher names its worker in its topic; only the one
// canonical spelling of a worker id is accepted, so respelling an id
// ("7", "07", "+7") cannot open a new sequence stream each time.
func TestParseTopic(t *testing.T) {
	for _, tc := range []struct {
		topic string
		id    uint64
		model string
		ok    bool
	}{
		{"kv@7@llama", 7, "llama", true},
		{"kv@0@m@with@ats", 0, "m@with@ats", true},
		{"kv@07@llama", 0, "", false},
		{"kv@+7@llama", 0, "", false},
		{"kv@7", 0, "", false},
		{"kv@x@m", 0, "", false},
		{"kv@18446744073709551616@m", 0, "", false},
		{"other@7@m", 0, "", false},
		// SGLang's snapshot parts, set aside.
		{"kv@7@llama\x00sgl-kv-epoch=9f2c", 7, "llama", true},
		{"kv@7@llama\x00sgl-kv-epoch=9f2c\x00sgl-kv-snapshot=41aa", 7, "llama", true},
		{"kv@7@llama\x00sgl-kv-epoch=", 0, "", false},
		{"kv@7@llama\x00other=1", 0, "", false},
		{"kv@7@llama\x00", 0, "", false},
		{"kv@7@llama\x00sgl-kv-epoch=" + strings.Repeat("a", maxTopicPart+1), 0, "", false},
	} {
		id, model, err := parseTopic(tc.topic)
		if (err == nil) != tc.ok || id != tc.id || model != tc.model {
			t.Errorf("parseTopic(%q) = %d, %q, %v; want %d, %q, ok %t", tc.topic, id, model, err, tc.id, tc.model, tc.ok)
		}
	}
}
