package caddymodule

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// The client gets the worker's stream event for event, without the usage
// chunk, however the stream is cut into writes.
func TestUsageStripper(t *testing.T) {
	usage := "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":64,\"prompt_tokens_details\":{\"cached_tokens\":48}}}\n\n"
	for _, sep := range []string{"\n\n", "\r\n\r\n"} {
		events := []string{
			"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}" + sep,
			"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}" + sep,
			"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"},\"finish_reason\":\"length\"}]}" + sep,
			strings.ReplaceAll(usage, "\n\n", sep),
			"data: [DONE]" + sep,
		}
		stream := strings.Join(events, "")
		want := strings.Replace(stream, events[3], "", 1)
		for _, chunk := range []int{1, 2, 5, 17, 64, len(stream)} {
			rec := httptest.NewRecorder()
			rec.Header().Set("Content-Type", "text/event-stream")
			s := newUsageStripper(rec)
			s.WriteHeader(http.StatusOK)
			for i := 0; i < len(stream); i += chunk {
				if n, err := s.Write([]byte(stream[i:min(i+chunk, len(stream))])); err != nil || n != min(chunk, len(stream)-i) {
					t.Fatalf("Write = %d, %v", n, err)
				}
			}
			s.finish()
			if got := rec.Body.String(); got != want {
				t.Fatalf("separator %q, chunks of %d: the client got\n%q\nwant\n%q", sep, chunk, got, want)
			}
		}
	}
	// An answer that is not an event stream passes untouched, usage and all.
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Type", "application/json")
	s := newUsageStripper(rec)
	_, _ = s.Write([]byte(usage))
	s.finish()
	if rec.Body.String() != usage {
		t.Fatalf("a JSON answer was changed: %q", rec.Body.String())
	}
	// A stream cut before its blank line still reaches the client.
	rec = httptest.NewRecorder()
	rec.Header().Set("Content-Type", "text/event-stream")
	s = newUsageStripper(rec)
	_, _ = s.Write([]byte("data: {\"choices\":[{\"delta\":{}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}"))
	s.finish()
	if !strings.HasSuffix(rec.Body.String(), `{"content":"x"}}]}`) {
		t.Fatalf("the last, incomplete event was lost: %q", rec.Body.String())
	}
}

// A worker that never ends its event cannot make the gateway hold it:
// past maxHeldEvent it goes on to the client as it comes.
func TestUsageStripperBoundsAnEndlessEvent(t *testing.T) {
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Type", "text/event-stream")
	s := newUsageStripper(rec)
	chunk := []byte("data: " + strings.Repeat("x", 4090))
	sent := 0
	for range 256 { // 1 MiB without a blank line
		if _, err := s.Write(chunk); err != nil {
			t.Fatal(err)
		}
		sent += len(chunk)
		if len(s.pending) > maxHeldEvent {
			t.Fatalf("holding %d bytes of one event", len(s.pending))
		}
	}
	s.finish()
	if rec.Body.Len() != sent {
		t.Fatalf("the client got %d of %d bytes", rec.Body.Len(), sent)
	}
}

func TestAddUsageOption(t *testing.T) {
	for _, c := range []struct {
		body string
		ok   bool
	}{
		{`{"model":"m","stream":true,"messages":[]}`, true},
		{"{\"model\":\"m\",\"stream\":true}\n  ", true},
		{`{}`, false},
		{`{ }`, false},
		{`[1]`, false},
	} {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(c.body))
		if got := addUsageOption(r, []byte(c.body), new(bodyLease)); got != c.ok {
			t.Fatalf("%s: added %v, want %v", c.body, got, c.ok)
		}
		if !c.ok {
			continue
		}
		for _, open := range []func() io.Reader{
			func() io.Reader { return r.Body },
			func() io.Reader { b, _ := r.GetBody(); return b },
		} {
			b, _ := io.ReadAll(open())
			if int64(len(b)) != r.ContentLength {
				t.Fatalf("%s: body of %d bytes, Content-Length %d", c.body, len(b), r.ContentLength)
			}
			var v struct {
				Model         string
				StreamOptions map[string]bool `json:"stream_options"`
			}
			if err := json.Unmarshal(b, &v); err != nil || v.Model != "m" || !v.StreamOptions["include_usage"] {
				t.Fatalf("%s became %s (%v)", c.body, b, err)
			}
		}
	}
	for _, c := range []struct {
		f    streamFields
		want bool
	}{
		{streamFields{Stream: []byte("true")}, true},
		{streamFields{Stream: []byte("true"), StreamOptions: []byte("null")}, true},
		{streamFields{Stream: []byte("true"), StreamOptions: []byte(`{"include_usage":false}`)}, false},
		{streamFields{Stream: []byte("false")}, false},
		{streamFields{}, false},
		// vLLM's pydantic reads these as true and streams.
		{streamFields{Stream: []byte(`"true"`)}, true},
		{streamFields{Stream: []byte("1")}, true},
		{streamFields{Stream: []byte(`"off"`)}, false},
	} {
		if got := c.f.wantsUsageAdded(); got != c.want {
			t.Errorf("%s/%s: %v, want %v", c.f.Stream, c.f.StreamOptions, got, c.want)
		}
	}
}

// The handler's decoder fills streamFields from a request body.
func TestStreamFieldsDecoded(t *testing.T) {
	var o openAIRequest
	if err := selection.DecodeJSON([]byte(`{"model":"m","stream":true,"messages":[]}`), &o); err != nil {
		t.Fatal(err)
	}
	if !o.wantsUsageAdded() {
		t.Fatalf("stream %q options %q: usage not added", o.Stream, o.StreamOptions)
	}
	o = openAIRequest{}
	if err := selection.DecodeJSON([]byte(`{"model":"m","stream":true,"stream_options":{"include_usage":false}}`), &o); err != nil {
		t.Fatal(err)
	}
	if o.wantsUsageAdded() {
		t.Fatal("a stream that named stream_options was changed")
	}
}
