package main

import (
	"encoding/binary"
	"fmt"
	"runtime"

	zmq "github.com/pebbe/zmq4"
)

// endMarker is the sequence frame that ends a replay: -1 as 8 bytes.
var endMarker = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// serveReplay is the replay server goroutine (vLLM's ROUTER protocol,
// docs/kv-events.md §2). It creates, uses and closes every rank's
// ROUTER socket and the control PULL socket, and sleeps in zmq_poll
// without a timeout until a request or a control message arrives.
func (p *publisher) serveReplay(cfg *Config, ready chan<- error) {
	defer close(p.replayDone)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	ctl, err := p.zctx.NewSocket(zmq.PULL)
	if err == nil {
		err = ctl.Bind(p.ctl)
	}
	if err != nil {
		ready <- fmt.Errorf("control socket: %w", err)
		return
	}
	defer ctl.Close()

	socks := make([]*zmq.Socket, len(p.ranks))
	owner := make(map[*zmq.Socket]*rankPub, len(p.ranks))
	defer func() {
		for _, s := range socks {
			if s != nil {
				s.Close()
			}
		}
	}()
	for i, r := range p.ranks {
		s, err := p.zctx.NewSocket(zmq.ROUTER)
		if err != nil {
			ready <- err
			return
		}
		socks[i] = s
		owner[s] = r
		_ = s.SetLinger(0)
		// A replay can be 10,000 batches long; the default high-water mark
		// of 1,000 would make the ROUTER drop the rest, end marker included.
		_ = s.SetSndhwm(0)
		ep := cfg.zmqEndpoint(cfg.ReplayBasePort, r.worker-1, r.dpRank)
		if err := s.Bind(ep); err != nil {
			ready <- fmt.Errorf("worker %d rank %d: bind replay %s: %w", r.worker, r.dpRank, ep, err)
			return
		}
		r.ReplayEndpoint, _ = s.GetLastEndpoint()
	}
	ready <- nil

	poller := p.replayPoller(ctl, socks)
	for {
		polled, err := poller.Poll(-1)
		if err != nil {
			if zmq.AsErrno(err) == zmq.ETERM {
				return
			}
			continue
		}
		for _, it := range polled {
			if it.Socket != ctl {
				answerReplays(it.Socket, owner[it.Socket])
				continue
			}
			// Take every control message waiting, and rebuild the poller
			// once: when a whole fleet stops, a thousand closes arrive
			// together, and rebuilding (and polling a thousand sockets)
			// after each one takes seconds.
			closed := false
			for {
				msg, err := ctl.RecvMessageBytes(zmq.DONTWAIT)
				if err != nil {
					break
				}
				switch string(msg[0]) {
				case ctlQuit:
					return
				case ctlClose:
					i := binary.BigEndian.Uint64(msg[1])
					if socks[i] != nil {
						delete(owner, socks[i])
						socks[i].Close()
						socks[i] = nil
						closed = true
					}
				}
			}
			if closed {
				poller = p.replayPoller(ctl, socks)
			}
		}
	}
}

// replayPoller polls the control socket and every open ROUTER.
func (p *publisher) replayPoller(ctl *zmq.Socket, socks []*zmq.Socket) *zmq.Poller {
	poller := zmq.NewPoller()
	poller.Add(ctl, zmq.POLLIN)
	for _, s := range socks {
		if s != nil {
			poller.Add(s, zmq.POLLIN)
		}
	}
	return poller
}

// answerReplays serves every request waiting on s. A request is exactly
// [identity, "", start_seq (8 bytes)]; anything else is dropped, as vLLM
// does. The reply is one [identity, "", seq, payload] per buffered batch
// with seq >= start_seq, then [identity, "", FF×8, ""].
func answerReplays(s *zmq.Socket, r *rankPub) {
	for {
		f, err := s.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			return
		}
		if len(f) != 3 || len(f[1]) != 0 || len(f[2]) != 8 {
			continue
		}
		start := binary.BigEndian.Uint64(f[2])
		r.mu.Lock()
		out := r.buf.from(start)
		r.mu.Unlock()
		var seq8 [8]byte
		for _, b := range out {
			binary.BigEndian.PutUint64(seq8[:], b.seq)
			_, _ = s.SendMessage(f[0], []byte{}, seq8[:], b.payload)
		}
		_, _ = s.SendMessage(f[0], []byte{}, endMarker, []byte{})
	}
}
