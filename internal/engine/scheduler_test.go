package engine

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// req is a test request.
type req struct {
	id  int
	seq Seq
}

func (r *req) State() *Seq { return &r.seq }

var testConfig = Config{BlockSize: 4, MaxBatchedTokens: 16, MaxNumSeqs: 4, PrefillRate: 1000, DecodeTime: 5 * time.Millisecond}

// hashesFor makes n chained block hashes starting from prefix.
func hashesFor(prefix uint64, n int) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		h[i] = prefix*1000 + uint64(i)
	}
	return h
}

func newReq(id int, prefix uint64, promptLen, maxTokens int) *req {
	return &req{id: id, seq: NewSeq(promptLen, hashesFor(prefix, promptLen/testConfig.BlockSize), maxTokens, testConfig.BlockSize)}
}

// drive runs the scheduler until idle, submitting arrivals at their times,
// and returns the first and last tokens with their virtual times. With
// bulk, runs of identical decode steps pass at once (DecodeRun, Advance).
func drive(arrivals map[time.Duration][]*req, bulk bool) []string {
	s := NewScheduler[*req](testConfig, 64)
	var log []string
	var now time.Duration
	times := make([]time.Duration, 0, len(arrivals))
	for t := range arrivals {
		times = append(times, t)
	}
	slices.Sort(times)
	arrive := func(until time.Duration) {
		for len(times) > 0 && times[0] <= until {
			for _, r := range arrivals[times[0]] {
				s.Submit(r)
			}
			times = times[1:]
		}
	}
	for len(times) > 0 || !s.Idle() {
		arrive(now)
		if s.Idle() {
			now = times[0]
			continue
		}
		if k := s.DecodeRun(); bulk && k > 1 {
			// Cut short at the step boundary after the next arrival.
			n := k - 1
			if len(times) > 0 && times[0] < now+time.Duration(n)*s.DecodeStep() {
				dt := s.DecodeStep()
				n = int((times[0] - now + dt - 1) / dt)
			}
			s.Advance(n)
			now += time.Duration(n) * s.DecodeStep()
			if n > 0 {
				continue
			}
		}
		st := s.Schedule(nil)
		now += st.Duration
		s.Complete(func(r *req, first, finished bool) {
			if first {
				log = append(log, fmt.Sprintf("%v first %d", now, r.id))
			}
			if finished {
				log = append(log, fmt.Sprintf("%v done %d", now, r.id))
			}
		})
	}
	return log
}

func TestDecodeRunsEqualStepByStep(t *testing.T) {
	mk := func() map[time.Duration][]*req {
		return map[time.Duration][]*req{
			0:                      {newReq(1, 1, 20, 40), newReq(2, 2, 9, 25)},
			37 * time.Millisecond:  {newReq(3, 1, 24, 30)},
			91 * time.Millisecond:  {newReq(4, 3, 30, 12)},
			400 * time.Millisecond: {newReq(5, 2, 13, 3), newReq(6, 4, 6, 50)},
		}
	}
	one, bulk := drive(mk(), false), drive(mk(), true)
	if !slices.Equal(one, bulk) {
		t.Fatalf("step by step:\n%v\nwith decode runs:\n%v", one, bulk)
	}
	if len(one) != 12 {
		t.Fatalf("%d first/last tokens, want 12: %v", len(one), one)
	}
}

func TestScheduleCachesPrefixesAndReportsRuns(t *testing.T) {
	s := NewScheduler[*req](testConfig, 64)
	a := newReq(1, 1, 12, 2) // three full blocks
	s.Submit(a)
	st := s.Schedule(nil)
	if len(st.Events) != 1 || st.Events[0].Req != a || st.Events[0].First != 0 || st.Events[0].Last != 3 || st.Prefill != 12 {
		t.Fatalf("first step: %+v", st)
	}
	if want := time.Duration(12.0/1000*float64(time.Second)) + testConfig.DecodeTime; st.Duration != want {
		t.Fatalf("duration %v, want %v", st.Duration, want)
	}
	s.Complete(func(*req, bool, bool) {})
	// The same prefix, longer: the cached blocks are hits (all but the
	// block holding the last prompt token, which is computed again only
	// when the prompt ends on a block boundary).
	b := newReq(2, 1, 16, 1)
	var admitted []*req
	s.Submit(b)
	st = s.Schedule(func(r *req) { admitted = append(admitted, r) })
	if len(admitted) != 1 || b.seq.HitTokens != 12 || st.Prefill != 4 {
		t.Fatalf("admitted %v, hits %d, prefill %d", admitted, b.seq.HitTokens, st.Prefill)
	}
	if len(st.Events) != 1 || st.Events[0].First != 3 || st.Events[0].Last != 4 {
		t.Fatalf("second step's events: %+v", st.Events)
	}
}

func TestAdmissionWaitsForFreeBlocks(t *testing.T) {
	s := NewScheduler[*req](testConfig, 8)
	big := newReq(1, 1, 16, 8) // 6 blocks
	next := newReq(2, 2, 8, 4) // 3 blocks: must wait for big
	last := newReq(3, 3, 4, 1) // 2 blocks: fits, but FIFO keeps it behind next
	s.Submit(big)
	s.Submit(next)
	s.Submit(last)
	s.Schedule(nil)
	if len(s.Running) != 1 || len(s.Waiting) != 2 {
		t.Fatalf("running %d waiting %d", len(s.Running), len(s.Waiting))
	}
	if s.DecodeRun() != 0 {
		t.Fatal("a prefill step is not a decode run")
	}
	s.Complete(func(*req, bool, bool) {})
	if k := s.DecodeRun(); k != 7 {
		t.Fatalf("decode run %d, want 7 (big's tokens left, the queue head does not fit)", k)
	}
}
