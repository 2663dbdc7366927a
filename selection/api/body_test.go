package api

import (
	"bytes"
	"io"
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

// trickle is a body that delivers some bytes and then fails, as a
// connection does that a client closes after sending a few bytes of a
// body it declared far larger.
type trickle struct {
	data []byte
	err  error
}

func (r *trickle) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

// TestReadBodyGrowsWithWhatArrives: a declared length is not allocated
// ahead of the bytes. Before, a body declaring 16 MiB made ReadBody
// allocate 16 MiB for its first 13 bytes.
func TestReadBodyGrowsWithWhatArrives(t *testing.T) {
	const declared = 16 << 20
	buf, err := ReadBody(nil, &trickle{data: []byte(`{"model":"m",`), err: io.ErrUnexpectedEOF}, declared, declared)
	if err == nil {
		t.Fatal("a body cut short read without an error")
	}
	if cap(buf) > bodyAhead {
		t.Fatalf("13 bytes of a body declaring %d took a buffer of %d bytes; want at most %d", declared, cap(buf), bodyAhead)
	}
}

// TestReadBodySizes: bodies of every size up to and past the limit read
// whole, with or without a declared length, and the room a known length
// leaves is its own size (no copy past it).
func TestReadBodySizes(t *testing.T) {
	const limit = 1 << 20
	for _, size := range []int{0, 1, 100, bodyAhead - 1, bodyAhead, bodyAhead + 1, 3*bodyAhead + 7, limit - 1, limit} {
		data := bytes.Repeat([]byte{'x'}, size)
		for _, declared := range []int64{-1, int64(size)} {
			buf, err := ReadBody(nil, bytes.NewReader(data), limit, declared)
			if err != nil || !bytes.Equal(buf, data) {
				t.Fatalf("size %d declared %d: %d bytes read, %v", size, declared, len(buf), err)
			}
			if declared == int64(size) && size > 0 && cap(buf) != size {
				t.Errorf("size %d declared: buffer of %d bytes", size, cap(buf))
			}
			if cap(buf) > 2*max(size, bodyAhead)+1 {
				t.Errorf("size %d declared %d: buffer of %d bytes", size, declared, cap(buf))
			}
		}
	}
	for _, declared := range []int64{-1, limit + 1} {
		buf, err := ReadBody(nil, bytes.NewReader(make([]byte, 4*limit)), limit, declared)
		if err != ErrBodyTooLarge || len(buf) != limit+1 {
			t.Fatalf("past the limit, declared %d: %d bytes read, %v; want %d and ErrBodyTooLarge", declared, len(buf), err, limit+1)
		}
	}
}
