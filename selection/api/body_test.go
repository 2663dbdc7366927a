package api

import (
	"bytes"
	"testing"
)

func TestReadBodyLimit(t *testing.T) {
	buf, err := ReadBody(nil, bytes.NewReader(make([]byte, 100)), 100, -1)
	if err != nil || len(buf) != 100 {
		t.Fatalf("at the limit: %d %v", len(buf), err)
	}
	if _, err := ReadBody(nil, bytes.NewReader(make([]byte, 101)), 100, -1); err != ErrBodyTooLarge {
		t.Fatalf("past the limit: %v", err)
	}
}

func TestIsJSONContentType(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json": true, "application/json; charset=utf-8": true, "application/vnd.api+json": true,
		"": false, "text/plain": false, "application/x-www-form-urlencoded": false, "json": false,
	} {
		if IsJSONContentType(ct) != want {
			t.Errorf("%q: want %v", ct, want)
		}
	}
}
