package caddymodule

import (
	"bytes"
	"io"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// A streamed completion reports usage only when the request asked for it
// (stream_options.include_usage, as OpenAI defines it; vLLM and SGLang
// follow). Most clients do not ask, so without help the gateway could not
// check its prediction on most streams. With request_usage on (the
// default), a stream that did not ask gets stream_options.include_usage
// added on its way to the worker, and the usage chunk the worker then
// sends (the last event before [DONE]: no choices, only usage) is read
// for the accounting and not passed to the client. The client sees the
// stream it asked for, event for event; nothing else in its request or
// in the answer changes. A stream whose request names stream_options
// (with include_usage false, or with other options) is left as it is.

// usageOption is appended to a request body that lacks stream_options.
// Appended last, it is the only stream_options key in the body.
const usageOption = `,"stream_options":{"include_usage":true}}`

// streamFields are the request fields that decide whether a stream
// reports usage.
type streamFields struct {
	Stream        selection.RawJSON `json:"stream"`
	StreamOptions selection.RawJSON `json:"stream_options"`
}

// wantsUsageAdded reports whether s is a stream that did not ask for usage
// and names no stream_options at all.
func (s *streamFields) wantsUsageAdded() bool {
	return laxTrue(s.Stream) && !s.StreamOptions.IsSet()
}

// addUsageOption makes r's body body with usageOption in place of its
// closing brace, without copying body: the proxy reads it through a
// MultiReader, again on a retry through GetBody. It reports false, leaving
// r alone, when body does not end in an object with a field in it.
func addUsageOption(r *http.Request, body []byte, lease *bodyLease) bool {
	end := len(bytes.TrimRight(body, " \t\r\n"))
	if end < 2 || body[end-1] != '}' || bytes.TrimRight(body[:end-1], " \t\r\n")[0] != '{' {
		return false
	}
	if inner := bytes.TrimSpace(body[1 : end-1]); len(inner) == 0 {
		return false
	}
	head := body[:end-1]
	open := func() io.Reader {
		return io.MultiReader(bytes.NewReader(head), strings.NewReader(usageOption))
	}
	_ = r.Body.Close() // the body it replaces is never read: not counted
	r.Body = lease.reader(open())
	r.ContentLength = int64(len(head) + len(usageOption))
	r.GetBody = func() (io.ReadCloser, error) { return lease.reader(open()), nil }
	return true
}

// usageStripper passes a worker's answer to the client without the usage
// chunk the gateway asked for. It holds back at most one incomplete event
// (an SSE event ends at a blank line) of at most maxHeldEvent bytes, so it
// never delays a whole one.
// An answer that is not a 200 event stream passes through untouched.
type usageStripper struct {
	*caddyhttp.ResponseWriterWrapper
	sse     bool
	decided bool
	pending []byte // the start of an event not yet complete
}

func newUsageStripper(w http.ResponseWriter) *usageStripper {
	return &usageStripper{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}}
}

func (s *usageStripper) WriteHeader(status int) {
	if !s.decided && status >= 200 {
		s.decided = true
		ct := s.Header().Get("Content-Type")
		s.sse = status == http.StatusOK && strings.HasPrefix(ct, "text/event-stream")
	}
	s.ResponseWriterWrapper.WriteHeader(status)
}

func (s *usageStripper) Write(b []byte) (int, error) {
	if !s.decided {
		s.WriteHeader(http.StatusOK)
	}
	if !s.sse {
		return s.ResponseWriterWrapper.Write(b)
	}
	n := len(b)
	if len(s.pending) > 0 {
		s.pending = append(s.pending, b...)
		b = s.pending
	}
	rest, err := s.writeEvents(b)
	if err != nil {
		return 0, err
	}
	if len(rest) > maxHeldEvent {
		// Not a usage chunk (those are a few hundred bytes), and a worker
		// that never ends its event must not grow the gateway's memory:
		// pass it on as it comes.
		if err := s.writeRun(rest); err != nil {
			return 0, err
		}
		rest = nil
	}
	// Keep the incomplete event; copy it down when it came from pending.
	s.pending = append(s.pending[:0], rest...)
	return n, nil
}

// maxHeldEvent bounds the incomplete event the stripper holds back.
const maxHeldEvent = 64 << 10

// writeEvents writes the complete events at the start of b, all but the
// usage chunk, in as few writes as it can, and returns what is left of b:
// an incomplete event, or nothing.
func (s *usageStripper) writeEvents(b []byte) ([]byte, error) {
	start, pos := 0, 0 // the run of events not yet written is b[start:pos]
	for {
		end := eventEnd(b[pos:])
		if end < 0 {
			break
		}
		if isUsageChunk(b[pos : pos+end]) {
			if err := s.writeRun(b[start:pos]); err != nil {
				return nil, err
			}
			start = pos + end
		}
		pos += end
	}
	if err := s.writeRun(b[start:pos]); err != nil {
		return nil, err
	}
	return b[pos:], nil
}

// writeRun writes a run of whole events, if there is one.
func (s *usageStripper) writeRun(run []byte) error {
	if len(run) == 0 {
		return nil
	}
	_, err := s.ResponseWriterWrapper.Write(run)
	return err
}

// ReadFrom goes through Write, so no event bypasses the filter.
func (s *usageStripper) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(writerOnly{s}, r)
}

// finish writes an event left incomplete when the answer ended (a worker
// that closed without the blank line): the client gets every byte but the
// usage chunk.
func (s *usageStripper) finish() {
	if len(s.pending) > 0 && !isUsageChunk(s.pending) {
		_, _ = s.ResponseWriterWrapper.Write(s.pending)
	}
	s.pending = nil
}

// eventEnd is the length of the first complete SSE event in b, its
// terminating blank line included, or -1.
func eventEnd(b []byte) int {
	if i := bytes.Index(b, []byte("\n\n")); i >= 0 {
		if j := bytes.Index(b[:i+2], []byte("\r\n\r\n")); j >= 0 {
			return j + 4
		}
		return i + 2
	}
	if j := bytes.Index(b, []byte("\r\n\r\n")); j >= 0 {
		return j + 4
	}
	return -1
}

// isUsageChunk reports whether event is the chunk include_usage adds: a
// data event with no choices and a usage object.
func isUsageChunk(event []byte) bool {
	data, ok := bytes.CutPrefix(bytes.TrimLeft(event, "\r\n"), []byte("data:"))
	return ok && bytes.Contains(data, []byte(`"choices":[]`)) && bytes.Contains(data, []byte(`"usage":{`))
}
