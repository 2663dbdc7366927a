package selection

import (
	stdjson "encoding/json"
	"flag"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	json "github.com/goccy/go-json"
)

// plainSelect is the same request shape decoded the ordinary way: a plain
// []uint32 for token_ids. It is the baseline for encoding/json and goccy.
type plainSelect struct {
	ModelName    string   `json:"model_name"`
	RoutingGroup string   `json:"routing_group"`
	SelectionID  string   `json:"selection_id"`
	TokenIDs     []uint32 `json:"token_ids"`
	LoraName     string   `json:"lora_name"`
	IsEagle      *bool    `json:"is_eagle"`
}

// selectBody builds a /select body with n random token ids below 150,000.
func selectBody(n int) []byte {
	rng := rand.New(rand.NewPCG(42, 42))
	b := []byte(`{"model_name":"llama","routing_group":"default","selection_id":"bench-1","token_ids":[`)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(rng.IntN(150000)), 10)
	}
	return append(b, `],"lora_name":"","is_eagle":false}`...)
}

var selectBodyFile = flag.String("write-select-body", "",
	"write BenchmarkDecodeSelect100k's 100k-token body to this file, to time another decoder on the same bytes")

// TestWriteSelectBody writes the benchmark's body when asked to
// (-args -write-select-body FILE), and does nothing otherwise.
func TestWriteSelectBody(t *testing.T) {
	if *selectBodyFile == "" {
		t.Skip("no -write-select-body")
	}
	if err := os.WriteFile(*selectBodyFile, selectBody(100_000), 0o644); err != nil {
		t.Fatal(err)
	}
}

// decodeWarm decodes body into one reused request value, as the proxy
// path does, and checks that it held the benchmarks' 100,000 token ids.
func decodeWarm(b *testing.B, body []byte) {
	var req SelectRequest
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if err := DecodeJSON(body, &req); err != nil {
			b.Fatal(err)
		}
	}
	if len(req.TokenIDs) != 100_000 {
		b.Fatal(len(req.TokenIDs))
	}
}

func BenchmarkDecodeSelect100k(b *testing.B) {
	body := selectBody(100_000)
	b.Run("ours", func(b *testing.B) { decodeWarm(b, body) })
	b.Run("ours_cold", func(b *testing.B) {
		// A fresh request value each time: the token slice is allocated.
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			var req SelectRequest
			if err := DecodeJSON(body, &req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("goccy_plain", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			var req plainSelect
			if err := json.Unmarshal(body, &req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			var req plainSelect
			if err := stdjson.Unmarshal(body, &req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bare_pass", func(b *testing.B) {
		// The floor: one loop over the bytes that accumulates every digit
		// run into a value, with no validation and no output slice.
		b.SetBytes(int64(len(body)))
		var sink uint64
		for b.Loop() {
			var v, sum uint64
			for _, c := range body {
				if d := c - '0'; d <= 9 {
					v = v*10 + uint64(d)
				} else {
					sum += v
					v = 0
				}
			}
			sink += sum
		}
		_ = sink
	})
}
