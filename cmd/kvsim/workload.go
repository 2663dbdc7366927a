package main

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/kvrouter/caddy-kvrouter/internal/trace"
)

// workload starts the arrivals of a run.
type workload interface {
	start(s *sim) error
}

// sessionWorkload is the seed setup: a fixed number of concurrent agentic
// sessions, closed loop. A session's turn sends its whole context (a
// shared system prompt, then its own history); when the answer ends, the
// session "runs a tool" for a think time, and its next turn's prompt is
// the previous prompt plus the answer plus new user text (the tool's
// output). A session whose context passes its end length is over, and a
// new one takes its place. Every random draw of a session comes from its
// own stream of the seed, so the same sessions ask the same turns whatever
// the policy and its timing.
type sessionWorkload struct {
	cfg *config
}

// session is one agentic conversation.
type session struct {
	slot    int
	serial  int // sessions the slot has had before this one
	id      uint64
	rng     *rand.Rand
	content blocks
	isl     int // the next turn's prompt, in tokens
	endISL  int
	last    *worker // where the previous turn ran
}

func (wl sessionWorkload) start(s *sim) error {
	c := wl.cfg
	if c.SystemPrompt >= c.StartMin {
		return fmt.Errorf("--system-prompt %d must be below --start-min %d", c.SystemPrompt, c.StartMin)
	}
	for slot := range c.Sessions {
		ss := wl.newSession(s, slot, 0, true)
		// Starts are spread over the ramp so that the cold first turns of a
		// fleet-wide start do not all queue at once.
		at := time.Duration(ss.rng.Float64() * float64(c.Ramp))
		s.clock.at(at, func() { wl.turn(s, ss) })
	}
	return nil
}

// newSession starts slot's serial-th session. The sessions present at the
// start are caught at a random point of their life (their context already
// between the start and end lengths), so the run starts near its steady
// mix of context lengths; later ones start at the beginning.
func (wl sessionWorkload) newSession(s *sim, slot, serial int, initial bool) *session {
	c := wl.cfg
	id := uint64(slot)<<24 | uint64(serial)
	rng := rand.New(rand.NewPCG(c.Seed, id+1))
	ss := &session{slot: slot, serial: serial, id: id, rng: rng}
	ss.isl = c.StartMin + rng.IntN(c.StartMax-c.StartMin+1)
	ss.endISL = c.EndMin + rng.IntN(c.EndMax-c.EndMin+1)
	if initial {
		ss.isl += rng.IntN(max(ss.endISL-ss.isl, 1))
	}
	return ss
}

// grow makes sure the session's content has the blocks of its next prompt:
// the system prompt's shared blocks first, then blocks of its own.
func (wl sessionWorkload) grow(s *sim, ss *session) {
	bs := wl.cfg.BlockSize
	sys := wl.cfg.SystemPrompt / bs
	for k := len(ss.content.ids); k < ss.isl/bs; k++ {
		var id int64
		if k < sys {
			id = int64(k + 1) // the shared system prompt
		} else {
			id = int64(mix64(ss.id<<20|uint64(k))>>2) + 1<<40
		}
		ss.content.push(s.hasher, id)
	}
}

// turn sends the session's next prompt.
func (wl sessionWorkload) turn(s *sim, ss *session) {
	c := wl.cfg
	wl.grow(s, ss)
	out := c.OutputMin + ss.rng.IntN(c.OutputMax-c.OutputMin+1)
	j := s.newJob(&ss.content, ss.isl, out, ss)
	j.sess = ss
	if !s.dispatch(j) {
		wl.next(s, ss, out)
	}
}

// turnDone schedules the session's next turn after its think time.
func (ss *session) turnDone(s *sim, j *job) {
	sessionWorkload{cfg: s.cfg}.next(s, ss, j.seq.MaxTokens)
}

// next grows the context by the answer and new user text, and schedules
// the next turn (of a new session in the slot when this one is over).
func (wl sessionWorkload) next(s *sim, ss *session, out int) {
	c := wl.cfg
	think := time.Duration(float64(c.ThinkMin) + ss.rng.Float64()*float64(c.ThinkMax-c.ThinkMin))
	ss.isl += out + c.UserMin + ss.rng.IntN(c.UserMax-c.UserMin+1)
	if ss.isl > ss.endISL {
		ss = wl.newSession(s, ss.slot, ss.serial+1, false)
	}
	s.clock.after(think, func() { wl.turn(s, ss) })
}

// traceWorkload replays a Mooncake-format trace, open loop: each request
// arrives at its timestamp divided by the speed, whatever happened to the
// earlier ones.
type traceWorkload struct {
	cfg  *config
	reqs []trace.Request
}

// loadTrace reads the first n requests of the trace and drops those the
// engines would refuse (longer than the model, or larger than a cache).
func loadTrace(cfg *config) (traceWorkload, int, error) {
	reqs, err := trace.ReadFile(cfg.Trace, cfg.BlockSize)
	if err != nil {
		return traceWorkload{}, 0, err
	}
	if cfg.TraceRequests > 0 && cfg.TraceRequests < len(reqs) {
		reqs = reqs[:cfg.TraceRequests]
	}
	var keep []trace.Request
	skipped := 0
	for _, r := range reqs {
		out := max(r.Output, 1)
		if cfg.MaxModelLen > 0 && r.Input+out > cfg.MaxModelLen || (r.Input+out+cfg.BlockSize-1)/cfg.BlockSize > cfg.KVBlocks {
			skipped++
			continue
		}
		keep = append(keep, r)
	}
	return traceWorkload{cfg: cfg, reqs: keep}, skipped, nil
}

// lastArrival is the virtual time of the last request.
func (wl traceWorkload) lastArrival() time.Duration {
	if len(wl.reqs) == 0 {
		return 0
	}
	return time.Duration(float64(wl.reqs[len(wl.reqs)-1].Arrival) / wl.cfg.Speed)
}

func (wl traceWorkload) start(s *sim) error {
	for i := range wl.reqs {
		r := &wl.reqs[i]
		at := time.Duration(float64(r.Arrival) / wl.cfg.Speed)
		s.clock.at(at, func() {
			var b blocks
			for _, id := range r.Blocks[:r.Input/wl.cfg.BlockSize] {
				b.push(s.hasher, id)
			}
			j := s.newJob(&b, r.Input, max(r.Output, 1), nil)
			s.dispatch(j)
		})
	}
	return nil
}

// mix64 is SplitMix64's finalizer, to name a session's own blocks.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}
