package caddymodule

import (
	"bytes"
	"mime/multipart"
	"strings"
	"testing"
)

// TestFormModel: the model field is read wherever it is among the first
// parts, up to its bound; a form of many parts is refused after
// maxFormParts of them, not read to its end (a 16 MiB body holds about a
// million empty parts, each a header map allocated).
func TestFormModel(t *testing.T) {
	form := func(fields ...string) ([]byte, string) {
		var b bytes.Buffer
		mw := multipart.NewWriter(&b)
		for i := 0; i+1 < len(fields); i += 2 {
			_ = mw.WriteField(fields[i], fields[i+1])
		}
		_ = mw.Close()
		return b.Bytes(), mw.Boundary()
	}
	body, boundary := form("language", "en", "model", "whisper")
	if m, err := formModel(body, boundary); m != "whisper" || err != nil {
		t.Fatalf("model %q, %v", m, err)
	}
	body, boundary = form("language", "en")
	if m, err := formModel(body, boundary); m != "" || err != nil {
		t.Fatalf("no model: %q, %v", m, err)
	}
	body, boundary = form("model", strings.Repeat("m", maxFormModel+1))
	if _, err := formModel(body, boundary); err == nil {
		t.Fatal("an over-long model was read")
	}
	var many []string
	for range 1000 {
		many = append(many, "x", "")
	}
	body, boundary = form(append(many, "model", "whisper")...)
	if _, err := formModel(body, boundary); err == nil {
		t.Fatal("a form of 1,000 parts was read to its model field")
	}
}
