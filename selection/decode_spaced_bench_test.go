package selection

import (
	"bytes"
	"testing"
)

// BenchmarkDecodeSelect100kSpaced decodes the body of
// BenchmarkDecodeSelect100k written with ", " between the token ids, as
// Python's json.dumps writes arrays by default (aiohttp's and requests'
// json= bodies), into a reused request value.
func BenchmarkDecodeSelect100kSpaced(b *testing.B) {
	body := bytes.ReplaceAll(selectBody(100_000), []byte(","), []byte(", "))
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
