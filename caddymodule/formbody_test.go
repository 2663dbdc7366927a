package caddymodule

import (
	"bytes"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
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

// TestFormModelAsStarletteReadsIt: vLLM's server takes the last of
// several model fields, decodes no Content-Transfer-Encoding, reads a
// part's name whatever its disposition's type (or with none, or beside a
// parameter of no value), and takes neither a preamble nor blanks after a
// delimiter; the gateway had taken the first, decoded quoted-printable
// (as Go's reader does) and skipped any part not "form-data", so a
// request could be routed to one model's workers while the engine read
// another.
func TestFormModelAsStarletteReadsIt(t *testing.T) {
	const b = "xYz"
	part := func(header, value string) string {
		return "--" + b + "\r\n" + header + "\r\n\r\n" + value + "\r\n"
	}
	for _, tc := range []struct {
		name, body, want string
	}{
		{"last wins", part(`Content-Disposition: form-data; name="model"`, "first") + part(`Content-Disposition: form-data; name="model"`, "last") + "--" + b + "--\r\n", "last"},
		{"no decoding", part("Content-Disposition: form-data; name=\"model\"\r\nContent-Transfer-Encoding: quoted-printable", "=64efault") + "--" + b + "--", "=64efault"},
		{"any disposition", part(`Content-Disposition: attachment; name="model"`, "whisper") + "--" + b + "--", "whisper"},
		{"header case", part(`content-DISPOSITION: form-data; name=model`, "whisper") + "--" + b + "--", "whisper"},
		{"a parameter with no value", part(`Content-Disposition: form-data; name="model"; foo`, "whisper") + "--" + b + "--", "whisper"},
		{"no disposition type", part(`Content-Disposition: ; name="model"`, "whisper") + "--" + b + "--", "whisper"},
		{"a part without headers", "--" + b + "\r\n\r\nvalue\r\n" + part(`Content-Disposition: form-data; name="model"`, "whisper") + "--" + b + "--", "whisper"},
		{"a value holding CRLF", part(`Content-Disposition: form-data; name="prompt"`, "a\r\n-- not the boundary\r\n") + part(`Content-Disposition: form-data; name="model"`, "whisper") + "--" + b + "--", "whisper"},
	} {
		if got, err := formModel([]byte(tc.body), b); got != tc.want || err != nil {
			t.Errorf("%s: model %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ name, body string }{
		{"no boundary in the body", `{"model":"nosuch","prompt":[1,2,3]}`},
		{"a preamble", "ignored\r\n" + part(`Content-Disposition: form-data; name="model"`, "whisper") + "--" + b + "--"},
		{"blanks after the first delimiter", "--" + b + "  \r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n--" + b + "--"},
		{"unterminated part", "--" + b + "\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper"},
		{"a header block over 8 KiB", part("Content-Disposition: form-data; name=\"model\""+strings.Repeat("\r\nA: 1", 2000), "whisper") + "--" + b + "--"},
		{"65 parts", strings.Repeat(part(`Content-Disposition: form-data; name="x"`, ""), maxFormParts) + part(`Content-Disposition: form-data; name="model"`, "whisper") + "--" + b + "--"},
	} {
		if got, err := formModel([]byte(tc.body), b); err == nil {
			t.Errorf("%s: read as model %q", tc.name, got)
		}
	}
}

// TestFormModelCost: 64 parts of 9,990 short headers each (5 MB) cost Go's
// multipart reader 126 MB of allocations; the scan refuses them at the
// first part's 8 KiB, and a 16 MiB file part costs no copy of it.
func TestFormModelCost(t *testing.T) {
	const b = "xYz"
	var hostile bytes.Buffer
	for range maxFormParts {
		hostile.WriteString("--" + b + "\r\nContent-Disposition: form-data; name=\"x\"\r\n")
		for i := range 9990 {
			fmt.Fprintf(&hostile, "A%d:\r\n", i)
		}
		hostile.WriteString("\r\nv\r\n")
	}
	hostile.WriteString("--" + b + "--")
	large := "--" + b + "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n" + strings.Repeat("a", 16<<20) +
		"\r\n--" + b + "\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n--" + b + "--"
	for _, tc := range []struct {
		name    string
		body    []byte
		wantErr bool
	}{
		{"headers", hostile.Bytes(), true},
		{"a 16 MiB file", []byte(large), false},
	} {
		var err error
		// The least of a few runs: TotalAlloc is the process's, and a
		// goroutine an earlier test left running counts in it.
		alloc := leastAlloc(func() { _, err = formModel(tc.body, b) })
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: %v", tc.name, err)
		}
		if alloc > 64<<10 {
			t.Errorf("%s: %d bytes allocated reading a %d-byte form", tc.name, alloc, len(tc.body))
		}
	}
}

// TestIsForm: only a multipart/form-data body on an audio route is read
// as a form; elsewhere the body is JSON whatever its Content-Type, so a
// multipart Content-Type on a completion does not skip the JSON checks.
func TestIsForm(t *testing.T) {
	for _, tc := range []struct {
		path, contentType string
		want              bool
	}{
		{"/v1/audio/transcriptions", "multipart/form-data; boundary=xYz", true},
		{"/v1/audio/translations", "Multipart/Form-Data; boundary=\"xYz\"", true},
		{"/v1/audio/transcriptions", "multipart/mixed; boundary=xYz", false},
		{"/v1/audio/transcriptions", "multipart/form-data", false},
		{"/v1/completions", "multipart/form-data; boundary=xYz", false},
		{"/v1/chat/completions", "multipart/form-data; boundary=xYz", false},
	} {
		r := httptest.NewRequest(http.MethodPost, tc.path, nil)
		r.Header.Set("Content-Type", tc.contentType)
		if _, got := isForm(r); got != tc.want {
			t.Errorf("%s %s: form %v, want %v", tc.path, tc.contentType, got, tc.want)
		}
	}
}
