package indexer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// libzmq queues a multipart message's frames until its last one arrives,
// and its bounds are per frame (ZMQ_MAXMSGSIZE) and per whole message
// (the high-water mark): a publisher that sends frames without an end
// makes it hold them all. zmtpScan reads what a publisher sends, as it
// passes, so that the connection can be cut at the header of the frame
// that breaks a message's bounds, before libzmq holds its body
// (docs/kv-events.md §9). It serves the frame gate in front of a libzmq
// SUB, which bind mode now keeps only as a benchmark's baseline (the
// gateway reads its publishers itself, zmtpconn.go); the greeting and
// frame checks below are the reader's too.
//
// It follows ZMTP 3.x (rfc.zeromq.org, specs 23 and 37): a 64-byte
// greeting (signature 0xFF, 8 padding bytes, 0x7F; major and minor
// version; a 20-byte mechanism name; as-server; filler), then frames of a
// flags byte (bit 0 more, bit 1 a long size, bit 2 a command; the rest
// zero), a size of 1 or 8 bytes (big-endian), and the body. Earlier ZMTP
// revisions, and mechanisms other than NULL (CURVE hides the frames'
// flags inside its MESSAGE commands), are refused: every engine that
// publishes KV events runs a libzmq that speaks 3.x with NULL.

const (
	zmtpGreeting = 64
	zmtpMore     = 0x01
	zmtpLong     = 0x02
	zmtpCommand  = 0x04
)

// errZMTP marks what the scan refuses; the connection is cut for it.
var errZMTP = errors.New("kv events publisher")

// zmtpScan is one connection's scan state; the zero value is not ready
// (newZMTPScan).
type zmtpScan struct {
	maxFrames int   // frames in one message
	maxBytes  int64 // bytes in one message, all frames; and in one command; < 0 no bound

	greeting [zmtpGreeting]byte
	greeted  int // greeting bytes seen

	header   [9]byte // the flags byte and a size of up to 8 bytes
	headerAt int     // header bytes seen; 0 between frames
	body     int64   // body bytes of the current frame still to pass
	frames   int     // frames of the current message so far
	bytes    int64   // its bytes so far

	// onTopic, when set, is shown each message's first frame (its topic,
	// docs/kv-events.md §2) once the frame is whole, and an error from it
	// cuts the connection; a topic longer than maxTopicBytes is cut at its
	// header. topic gathers the frame's body meanwhile; inTopic is set
	// while the current frame is a topic.
	onTopic func(topic []byte) error
	topic   []byte
	inTopic bool
}

// maxTopicBytes bounds a message's topic frame when the gate reads topics
// (topicguard.go): kv@<worker_id>@<model> with a model name of up to
// about a thousand bytes, where Hugging Face's names are under a hundred.
const maxTopicBytes = 1024

func newZMTPScan(maxFrames int, maxBytes int64) *zmtpScan {
	return &zmtpScan{maxFrames: maxFrames, maxBytes: maxBytes}
}

// scan reads the next bytes of the stream; an error means the stream
// broke a bound or the protocol, and nothing of p may be passed on.
func (s *zmtpScan) scan(p []byte) error {
	for len(p) > 0 {
		switch {
		case s.greeted < zmtpGreeting:
			n := copy(s.greeting[s.greeted:], p)
			if err := checkGreeting(&s.greeting, s.greeted, s.greeted+n); err != nil {
				return err
			}
			s.greeted += n
			p = p[n:]
		case s.body > 0:
			n := int64(len(p))
			if n > s.body {
				n = s.body
			}
			s.body -= n
			if s.inTopic {
				s.topic = append(s.topic, p[:n]...)
				if err := s.topicDone(); err != nil {
					return err
				}
			}
			p = p[n:]
		default:
			s.header[s.headerAt] = p[0]
			s.headerAt++
			p = p[1:]
			if err := s.frameHeader(); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkGreeting checks a greeting's bytes [from, to), once each has come
// (a scan's come piece by piece, a dial's at once).
func checkGreeting(g *[zmtpGreeting]byte, from, to int) error {
	has := func(i int) bool { return from <= i && i < to }
	switch {
	case has(0) && g[0] != 0xff, has(9) && g[9]&1 == 0:
		return fmt.Errorf("%w: not a ZMTP 3 greeting", errZMTP)
	case has(10) && g[10] < 3:
		return fmt.Errorf("%w: ZMTP revision %d; 3 or later is needed", errZMTP, g[10])
	case from < 32 && to >= 32: // the mechanism is whole
		mech := g[12:32]
		null := [20]byte{'N', 'U', 'L', 'L'}
		if [20]byte(mech) != null {
			return fmt.Errorf("%w: security mechanism is not NULL", errZMTP)
		}
	}
	return nil
}

// frameHeader takes a header byte; once the header is whole it checks
// the frame against the bounds and starts its body.
func (s *zmtpScan) frameHeader() error {
	flags := s.header[0]
	if err := checkFlags(flags); err != nil {
		return err
	}
	need := 2
	if flags&zmtpLong != 0 {
		need = 9
	}
	if s.headerAt < need {
		return nil
	}
	s.headerAt = 0
	var size uint64
	if need == 2 {
		size = uint64(s.header[1])
	} else {
		size = binary.BigEndian.Uint64(s.header[1:9])
	}
	if size > math.MaxInt64 {
		return fmt.Errorf("%w: frame size %d", errZMTP, size)
	}
	if flags&zmtpCommand != 0 {
		// A command (READY, PING, ...) is a unit of its own; it may come
		// between a message's frames and does not count among them.
		if s.maxBytes >= 0 && int64(size) > s.maxBytes {
			return fmt.Errorf("%w: a command of %d bytes", errZMTP, size)
		}
		s.body = int64(size)
		return nil
	}
	if err := checkMessageFrame(size, s.frames, s.bytes, s.maxFrames, s.maxBytes); err != nil {
		return err
	}
	s.frames++
	s.bytes += int64(size)
	s.body = int64(size)
	if s.onTopic != nil && s.frames == 1 {
		if err := checkTopicSize(size); err != nil {
			return err
		}
		s.inTopic, s.topic = true, s.topic[:0]
	}
	if flags&zmtpMore == 0 {
		s.frames, s.bytes = 0, 0
	}
	return s.topicDone()
}

// checkTopicSize refuses, from its header, a topic frame longer than
// maxTopicBytes when topics are checked.
func checkTopicSize(size uint64) error {
	if size > maxTopicBytes {
		return fmt.Errorf("%w: a topic of %d bytes", errZMTP, size)
	}
	return nil
}

// checkFlags refuses a frame's flags byte that ZMTP 3 does not allow:
// a reserved bit set, or a command with more set.
func checkFlags(flags byte) error {
	if flags&^(zmtpMore|zmtpLong|zmtpCommand) != 0 {
		return fmt.Errorf("%w: frame flags %#x", errZMTP, flags)
	}
	if flags&zmtpCommand != 0 && flags&zmtpMore != 0 {
		return fmt.Errorf("%w: frame flags %#x: a command with more set", errZMTP, flags)
	}
	return nil
}

// checkMessageFrame checks, from its header, a message frame of size bytes
// that follows frames frames of bytes bytes in all: a message has at most
// maxFrames frames and maxBytes bytes (maxBytes < 0: no bound).
func checkMessageFrame(size uint64, frames int, bytes int64, maxFrames int, maxBytes int64) error {
	if frames >= maxFrames {
		return fmt.Errorf("%w: a message of more than %d frames", errZMTP, maxFrames)
	}
	if maxBytes >= 0 && size > uint64(maxBytes-bytes) {
		return fmt.Errorf("%w: a message of more than %d bytes", errZMTP, maxBytes)
	}
	return nil
}

// topicDone shows the topic to onTopic once its frame's body has all come
// (at once for an empty topic).
func (s *zmtpScan) topicDone() error {
	if !s.inTopic || s.body > 0 {
		return nil
	}
	s.inTopic = false
	return s.onTopic(s.topic)
}
