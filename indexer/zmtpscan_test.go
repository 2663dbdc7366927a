package indexer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// zmtpGreetingFor builds a ZMTP greeting of the given major revision and
// mechanism, as a PUB (as-server 0) sends it.
func zmtpGreetingFor(major byte, mechanism string) []byte {
	g := make([]byte, zmtpGreeting)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, major, 1
	copy(g[12:32], mechanism)
	return g
}

// zmtpFrame encodes one frame, with a long size when the body needs one
// or long is set.
func zmtpFrame(flags byte, body []byte, long bool) []byte {
	if long || len(body) > 255 {
		h := make([]byte, 9, 9+len(body))
		h[0] = flags | zmtpLong
		binary.BigEndian.PutUint64(h[1:], uint64(len(body)))
		return append(h, body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

// zmtpMessage encodes a message of the given frames.
func zmtpMessage(frames ...[]byte) []byte {
	var b []byte
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = zmtpMore
		}
		b = append(b, zmtpFrame(flags, f, i == 1)...)
	}
	return b
}

// zmtpReady is a READY command naming a PUB.
func zmtpReady() []byte {
	body := append([]byte{5}, "READY"...)
	body = append(body, 11)
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, 3)
	body = append(body, "PUB"...)
	return zmtpFrame(zmtpCommand, body, false)
}

// scanIn feeds stream to a fresh scan in pieces of the given size, and
// returns the offset of the piece that failed (-1 for none) and its error.
func scanIn(stream []byte, piece, maxFrames int, maxBytes int64) (int, error) {
	s := newZMTPScan(maxFrames, maxBytes)
	for at := 0; at < len(stream); at += piece {
		end := min(at+piece, len(stream))
		if err := s.scan(stream[at:end]); err != nil {
			return at, err
		}
	}
	return -1, nil
}

// TestZMTPScanPasses: a publisher's well-formed stream passes in pieces
// of any size, commands between a message's frames included.
func TestZMTPScanPasses(t *testing.T) {
	payload := bytes.Repeat([]byte{0xab}, 300) // a long frame
	ping := zmtpFrame(zmtpCommand, append([]byte{4}, "PING\x00\x10"...), false)
	stream := append(zmtpGreetingFor(3, "NULL"), zmtpReady()...)
	for seq := range 3 {
		stream = append(stream, zmtpMessage([]byte("kv@5@m"), binary.BigEndian.AppendUint64(nil, uint64(seq)), payload)...)
	}
	// A PING between the first and second frames of a message.
	msg := zmtpMessage([]byte("kv@5@m"), make([]byte, 8), []byte{1})
	first := len(zmtpFrame(zmtpMore, []byte("kv@5@m"), false))
	stream = append(append(append(stream, msg[:first]...), ping...), msg[first:]...)
	stream = append(stream, zmtpMessage(nil, make([]byte, 8), nil)...) // empty frames
	for piece := 1; piece <= len(stream); piece++ {
		if at, err := scanIn(stream, piece, liveFrameCount, 1024); err != nil {
			t.Fatalf("pieces of %d: refused at %d: %v", piece, at, err)
		}
	}
}

// TestZMTPScanRefuses: each breach is refused at the header of the frame
// that breaks the bound, before its body: the pieces up to that header's
// last byte pass, and that byte fails.
func TestZMTPScanRefuses(t *testing.T) {
	head := append(zmtpGreetingFor(3, "NULL"), zmtpReady()...)
	one := []byte("kv@5@m")
	cases := []struct {
		name   string
		before []byte // passes
		bad    []byte // the header that is refused, ending with the failing byte
		want   string
	}{
		{"a fourth frame",
			append(append([]byte(nil), head...), zmtpFrame(zmtpMore, one, false)...),
			nil, "more than 3 frames"},
		{"a message over the byte bound in its third frame",
			append(append(append([]byte(nil), head...), zmtpFrame(zmtpMore, one, false)...), zmtpFrame(zmtpMore, make([]byte, 8), false)...),
			[]byte{zmtpLong, 0, 0, 0, 0, 0, 0, 1, 0x1f}, "more than 300 bytes"}, // 14 + 287
		{"a long size over the bound", head, func() []byte { h := make([]byte, 9); h[0] = zmtpLong; h[1] = 0x40; return h }(), "more than 300 bytes"},
		{"a size past int64", head, func() []byte { h := make([]byte, 9); h[0] = zmtpLong | zmtpMore; h[1] = 0x80; return h }(), "frame size"},
		{"a command over the bound", head, []byte{zmtpCommand | zmtpLong, 0, 0, 0, 0, 0, 0, 1, 0x2d}, "a command of 301 bytes"},
		{"a command with more", head, []byte{zmtpCommand | zmtpMore}, "more set"},
		{"reserved flags", head, []byte{0x08}, "frame flags"},
		{"ZMTP 1.0", nil, []byte{0x01}, "not a ZMTP 3 greeting"},
		{"no 0x7f", zmtpGreetingFor(3, "NULL")[:9], []byte{0x7e}, "not a ZMTP 3 greeting"},
		{"ZMTP 2.0", zmtpGreetingFor(1, "NULL")[:10], []byte{1}, "revision 1"},
		{"CURVE", zmtpGreetingFor(3, "CURVE")[:31], []byte{0}, "not NULL"},
	}
	for _, c := range cases {
		if c.bad == nil { // the fourth frame: three frames sent, then a header
			c.before = append(c.before, zmtpFrame(zmtpMore, make([]byte, 8), false)...)
			c.before = append(c.before, zmtpFrame(zmtpMore, []byte{1}, false)...)
			c.bad = []byte{0, 0}
		}
		s := newZMTPScan(liveFrameCount, 300)
		if err := s.scan(c.before); err != nil {
			t.Fatalf("%s: the bytes before the breach were refused: %v", c.name, err)
		}
		if err := s.scan(c.bad[:len(c.bad)-1]); err != nil {
			t.Fatalf("%s: refused before the header was whole: %v", c.name, err)
		}
		err := s.scan(c.bad[len(c.bad)-1:])
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: got %v, want %q", c.name, err, c.want)
		}
	}
}

// TestZMTPScanUnbounded: a negative byte bound lifts the bytes' bound,
// not the frames'.
func TestZMTPScanUnbounded(t *testing.T) {
	stream := append(zmtpGreetingFor(3, "NULL"), zmtpMessage(make([]byte, 1<<16), make([]byte, 8), make([]byte, 1<<16))...)
	if _, err := scanIn(stream, 4096, liveFrameCount, -1); err != nil {
		t.Fatal(err)
	}
	stream = append(stream, zmtpMessage(nil, nil, nil, nil)...)
	if _, err := scanIn(stream, 4096, liveFrameCount, -1); err == nil {
		t.Fatal("a four-frame message passed")
	}
}

// topicScan is a scan that records the topics it is shown.
func topicScan(seen *[]string) *zmtpScan {
	s := newZMTPScan(liveFrameCount, 1<<20)
	s.onTopic = func(topic []byte) error {
		*seen = append(*seen, string(topic))
		return nil
	}
	return s
}

// TestZMTPScanShowsTopics: each message's first frame, and only it, is
// shown whole once it has all come, whatever the pieces the stream comes
// in; an empty topic too; a command between a message's frames is not a
// topic; a topic over maxTopicBytes is refused at its header, and an
// error from onTopic refuses the piece that completed the topic.
func TestZMTPScanShowsTopics(t *testing.T) {
	long := bytes.Repeat([]byte{'t'}, maxTopicBytes) // the longest allowed, with a long size
	ping := zmtpFrame(zmtpCommand, append([]byte{4}, "PING\x00\x10"...), false)
	stream := append(zmtpGreetingFor(3, "NULL"), zmtpReady()...)
	msg := zmtpMessage([]byte("kv@5@m"), make([]byte, 8), []byte("kv@6@m"))
	first := len(zmtpFrame(zmtpMore, []byte("kv@5@m"), false))
	stream = append(append(append(stream, msg[:first]...), ping...), msg[first:]...)
	stream = append(stream, zmtpMessage(nil, make([]byte, 8), []byte{1})...)
	stream = append(stream, zmtpMessage(long, make([]byte, 8), []byte{1})...)
	stream = append(stream, zmtpFrame(0, []byte("alone"), false)...) // a message of one frame
	want := []string{"kv@5@m", "", string(long), "alone"}
	for piece := 1; piece <= len(stream); piece++ {
		var seen []string
		s := topicScan(&seen)
		for at := 0; at < len(stream); at += piece {
			if err := s.scan(stream[at:min(at+piece, len(stream))]); err != nil {
				t.Fatalf("pieces of %d: refused at %d: %v", piece, at, err)
			}
		}
		if !slices.Equal(seen, want) {
			t.Fatalf("pieces of %d: topics %q, want %q", piece, seen, want)
		}
	}

	var seen []string
	s := topicScan(&seen)
	tooLong := zmtpFrame(zmtpMore, make([]byte, maxTopicBytes+1), false)
	if err := s.scan(append(zmtpGreetingFor(3, "NULL"), tooLong[:8]...)); err != nil {
		t.Fatalf("refused before the header was whole: %v", err)
	}
	if err := s.scan(tooLong[8:9]); err == nil || !strings.Contains(err.Error(), "a topic of 1025 bytes") {
		t.Fatalf("a topic over the bound: %v", err)
	}

	s = newZMTPScan(liveFrameCount, 1<<20)
	s.onTopic = func(topic []byte) error { return fmt.Errorf("no %s", topic) }
	frame := zmtpFrame(zmtpMore, []byte("kv@5@m"), false)
	if err := s.scan(append(zmtpGreetingFor(3, "NULL"), frame[:len(frame)-1]...)); err != nil {
		t.Fatalf("refused before the topic was whole: %v", err)
	}
	if err := s.scan(frame[len(frame)-1:]); err == nil || err.Error() != "no kv@5@m" {
		t.Fatalf("the topic's last byte: %v", err)
	}
}

// FuzzZMTPScan: whatever a publisher sends, the scan does not panic, and
// its verdict, and the topics it shows, do not depend on how the stream
// is split into reads.
func FuzzZMTPScan(f *testing.F) {
	good := append(zmtpGreetingFor(3, "NULL"), zmtpReady()...)
	good = append(good, zmtpMessage([]byte("kv@5@m"), make([]byte, 8), bytes.Repeat([]byte{1}, 300))...)
	f.Add(good, uint16(70))
	f.Add(append(good, zmtpMessage(nil, nil, nil, nil)...), uint16(3))
	f.Add(zmtpGreetingFor(1, "NULL"), uint16(11))
	f.Fuzz(func(t *testing.T, stream []byte, at uint16) {
		split := int(at) % (len(stream) + 1)
		whole := newZMTPScan(liveFrameCount, 1024).scan(stream) == nil
		s := newZMTPScan(liveFrameCount, 1024)
		pieces := s.scan(stream[:split]) == nil && s.scan(stream[split:]) == nil
		if whole != pieces {
			t.Fatalf("whole %v, split at %d %v", whole, split, pieces)
		}
		var wholeTopics, splitTopics []string
		wholeOK := topicScan(&wholeTopics).scan(stream) == nil
		ts := topicScan(&splitTopics)
		splitOK := ts.scan(stream[:split]) == nil && ts.scan(stream[split:]) == nil
		if wholeOK != splitOK || !slices.Equal(wholeTopics, splitTopics) {
			t.Fatalf("topics: whole %v %q, split at %d %v %q", wholeOK, wholeTopics, split, splitOK, splitTopics)
		}
	})
}
