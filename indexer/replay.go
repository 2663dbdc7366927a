package indexer

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// replay dials the replay endpoint for one gap, asks for [from, …) and
// applies the replies below to, in order. A publisher whose buffer no
// longer reaches from starts later; the hole is skipped. It returns the
// last sequence applied and how many were.
func (l *stream) replay(dec *Decoder, from, to uint64) (last, got uint64, err error) {
	l.turn.leave() // the replies are a wait on the network
	deadline := time.Now().Add(l.cfg.replayTimeout())
	replies, err := l.openReplay(from, deadline)
	if err != nil {
		return 0, 0, err
	}
	defer replies.close()
	next := from
	for {
		frames, err := replies.next()
		select {
		case <-l.stop:
			return last, got, errors.New("stopped")
		default:
		}
		if err != nil {
			if errors.Is(err, errZMTP) {
				l.stats.Cut.add(1) // a reply past the bounds
			}
			return last, got, err
		}
		seq, payload, ok := replayFrames(frames)
		if !ok {
			l.stats.Malformed.add(1)
			continue
		}
		if seq == endSeq {
			return last, got, nil
		}
		if seq < next || seq >= to {
			continue // before what we asked, or already live
		}
		_, applied := l.apply(dec, payload)
		l.turn.leave() // so is the next reply
		last, next = seq, seq+1
		if applied { // else counted by apply, and lost with the gap's rest
			l.stats.Replayed.add(1)
			got++
		}
	}
}

// replies are one exchange's replies: next returns each one's frames, and
// an error once the exchange is over (its deadline, the publisher gone,
// a bound broken, the listener stopping).
type replies interface {
	next() ([][]byte, error)
	close()
}

var errReplayTimeout = errors.New("replay timed out")

// openReplay starts an exchange: over the gateway's own DEALER for the
// endpoints it dials itself (replaydial.go), else (inproc://, or a
// source named by its interface) through libzmq's.
func (l *stream) openReplay(from uint64, deadline time.Time) (replies, error) {
	t, ok := dialTargetOf(l.cfg.Replay)
	if !ok {
		return l.openZMQReplay(from, deadline)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	go func() { // the listener's stop ends the exchange, or its dial
		select {
		case <-l.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	rc, err := dialReplay(ctx, t, from, maxMsgSize(l.cfg.MaxMessageBytes), deadline)
	if err != nil {
		cancel()
		return nil, err
	}
	context.AfterFunc(ctx, rc.close) // which ends a read under way
	return &nativeReplies{rc: rc, cancel: cancel}, nil
}

// nativeReplies reads an exchange over replayConn.
type nativeReplies struct {
	rc     *replayConn
	cancel context.CancelFunc
}

func (n *nativeReplies) next() ([][]byte, error) {
	frames, err := n.rc.next()
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return nil, errReplayTimeout
	}
	return frames, err
}

func (n *nativeReplies) close() { n.cancel() }

// zmqReplies reads an exchange through a libzmq DEALER, which bounds
// each frame of a reply (not the reply): kept for the endpoints that only
// libzmq dials, which are this process's (inproc://) or the operator's.
type zmqReplies struct {
	d        *zmq.Socket
	deadline time.Time
	stop     <-chan struct{}
}

func (l *stream) openZMQReplay(from uint64, deadline time.Time) (replies, error) {
	d, err := l.zctx.NewSocket(zmq.DEALER)
	if err != nil {
		return nil, err
	}
	for _, err := range []error{d.SetLinger(0), d.SetIpv6(libzmqIPv6(l.cfg.Replay)), d.SetMaxmsgsize(maxMsgSize(l.cfg.MaxMessageBytes)),
		d.SetRcvtimeo(50 * time.Millisecond), d.SetSndtimeo(l.cfg.replayTimeout()), d.Connect(l.cfg.Replay)} {
		if err != nil {
			d.Close()
			return nil, err
		}
	}
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], from)
	if _, err := d.SendMessage([]byte{}, req[:]); err != nil {
		d.Close()
		return nil, err
	}
	return &zmqReplies{d: d, deadline: deadline, stop: l.stop}, nil
}

func (z *zmqReplies) next() ([][]byte, error) {
	for time.Now().Before(z.deadline) {
		select {
		case <-z.stop:
			return nil, errors.New("stopped")
		default:
		}
		frames, err := z.d.RecvMessageBytes(0)
		if zmq.AsErrno(err) == zmq.ETERM {
			return nil, err // the context is ending: so is every receive
		}
		if err == nil {
			return frames, nil
		}
		// a receive timeout: check the deadline and the stop
	}
	return nil, errReplayTimeout
}

func (z *zmqReplies) close() { z.d.Close() }
