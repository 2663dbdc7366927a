package selection

import (
	"bytes"
	"testing"
)

// BenchmarkDecodeSelect100kSeparators decodes the body of
// BenchmarkDecodeSelect100k written with other separators between the
// token ids, into a reused request value: ", " (Python's json.dumps
// default, so aiohttp's and requests' json= bodies), which the fast path
// takes, and a pretty-printer's ",\n    " and a " , ", which go through
// the byte-at-a-time loop.
func BenchmarkDecodeSelect100kSeparators(b *testing.B) {
	for _, sep := range []struct{ name, sep string }{
		{"comma_space", ", "}, {"comma_newline_indent", ",\n    "}, {"space_comma_space", " , "},
	} {
		body := bytes.ReplaceAll(selectBody(100_000), []byte(","), []byte(sep.sep))
		b.Run(sep.name, func(b *testing.B) { decodeWarm(b, body) })
	}
}
