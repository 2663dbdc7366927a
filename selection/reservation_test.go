package selection

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// ledgerCall is one call a Reservation made of its router.
type ledgerCall struct {
	op      string // reserve, prefill, output, free, status, failure
	id      string // the booking's selection id (reserve: the new one, "" when it failed)
	rank    Rank   // reserve: the rank booked
	exclude []Rank // reserve: the ranks the request excluded
}

// tracingLedger records, in order, what one handle asks of the router,
// and passes it on. A handle calls its ledger with its lock held, so the
// log is the order the router saw.
type tracingLedger struct {
	inner ledger
	mu    sync.Mutex
	log   []ledgerCall
	cur   string // the id the last reserve returned
}

func (l *tracingLedger) add(c ledgerCall) {
	l.mu.Lock()
	l.log = append(l.log, c)
	l.mu.Unlock()
}

func (l *tracingLedger) reserve(req *SelectRequest, explain bool) (*SelectResponse, error) {
	resp, err := l.inner.reserve(req, explain)
	c := ledgerCall{op: "reserve", exclude: slices.Clone(req.Placement.ExcludeRanks)}
	if err == nil {
		c.id, c.rank = resp.SelectionID, Rank{resp.WorkerID, resp.DPRank}
	}
	l.cur = c.id
	l.add(c)
	return resp, err
}

func (l *tracingLedger) prefillComplete(id string) error {
	l.add(ledgerCall{op: "prefill", id: id})
	return l.inner.prefillComplete(id)
}

func (l *tracingLedger) outputBlock(id string, decay *float64) error {
	l.add(ledgerCall{op: "output", id: id})
	return l.inner.outputBlock(id, decay)
}

func (l *tracingLedger) free(id string) error {
	l.add(ledgerCall{op: "free", id: id})
	return l.inner.free(id)
}

// Health calls name a worker, not a booking: they are logged against the
// booking the last reserve made.
func (l *tracingLedger) reportStatus(workerID uint64, status int) {
	l.add(ledgerCall{op: "status", id: l.cur})
	l.inner.reportStatus(workerID, status)
}

func (l *tracingLedger) reportFailure(workerID uint64) {
	l.add(ledgerCall{op: "failure", id: l.cur})
	l.inner.reportFailure(workerID)
}

func (l *tracingLedger) record(d *bookingRecord) {
	l.add(ledgerCall{op: "record", id: l.cur})
	l.inner.record(d)
}

// checkLifecycle checks one released handle's log: every booking is freed
// exactly once and used only before that, its prefill completes at most
// once, the health hears about it at most once, its deferred record is
// recorded at most once, and no rank is booked twice (each new booking
// excludes every rank booked before).
func checkLifecycle(log []ledgerCall) error {
	type state struct{ prefills, health, frees, records int }
	bookings := map[string]*state{}
	var booked []Rank
	for i, c := range log {
		if c.op == "reserve" {
			for _, rk := range booked {
				if !slices.Contains(c.exclude, rk) {
					return fmt.Errorf("call %d: a booking did not exclude the tried rank %v", i, rk)
				}
			}
			if c.id == "" {
				continue
			}
			if slices.Contains(booked, c.rank) {
				return fmt.Errorf("call %d: rank %v booked again", i, c.rank)
			}
			booked = append(booked, c.rank)
			bookings[c.id] = &state{}
			continue
		}
		s := bookings[c.id]
		if s == nil {
			return fmt.Errorf("call %d: %s of %q, which was never booked", i, c.op, c.id)
		}
		switch c.op {
		case "prefill", "output":
			if s.frees > 0 {
				return fmt.Errorf("call %d: %s of %s after its free", i, c.op, c.id)
			}
			if c.op == "prefill" {
				s.prefills++
			}
		case "free":
			s.frees++
		case "status", "failure":
			s.health++
		case "record":
			s.records++
		}
		if s.prefills > 1 || s.health > 1 || s.frees > 1 || s.records > 1 {
			return fmt.Errorf("call %d: booking %s: %d prefills, %d health reports, %d frees, %d records", i, c.id, s.prefills, s.health, s.frees, s.records)
		}
	}
	for id, s := range bookings {
		if s.frees != 1 {
			return fmt.Errorf("booking %s freed %d times", id, s.frees)
		}
	}
	return nil
}

// reservationRouter is a router with four workers, one of them with two
// data-parallel ranks: five ranks to fail over across.
func reservationRouter(t *testing.T) (*Router, []Rank) {
	r := newTestRouter(t, nil)
	for id := uint64(1); id <= 4; id++ {
		addWorker(t, r, id, func(w *WorkerRequest) {
			w.Endpoint = ptr(fmt.Sprintf("http://127.0.0.1:%d/", 9000+id))
			if id == 4 {
				w.DataParallelSize = ptr(uint32(2))
			}
		})
	}
	return r, []Rank{{1, 0}, {2, 0}, {3, 0}, {4, 0}, {4, 1}}
}

func promptOf(rng *rand.Rand) Prompt {
	toks := make([]uint32, 16*(1+rng.IntN(4)))
	for i := range toks {
		toks[i] = rng.Uint32()
	}
	return Prompt{TokenIDs: toks}
}

// TestReservationLifecycle walks one handle through a failover to the end
// of its ranks.
func TestReservationLifecycle(t *testing.T) {
	r, ranks := reservationRouter(t)
	h, err := r.Reserve(&SelectRequest{Prompt: promptOf(rand.New(rand.NewPCG(1, 1)))}, true)
	if err != nil {
		t.Fatal(err)
	}
	first := h.Response()
	if len(first.Candidates) != len(ranks) {
		t.Fatalf("explain: %d candidates, want %d", len(first.Candidates), len(ranks))
	}
	if want := fmt.Sprintf("127.0.0.1:%d", 9000+first.WorkerID); h.Target() != want {
		t.Fatalf("target %q, want %q", h.Target(), want)
	}
	if first.EffectivePrefillTokens == 0 || loadOf(r, first.WorkerID, first.DPRank).PotentialPrefillTokens != first.EffectivePrefillTokens {
		t.Fatalf("booking's prefill %d not on its rank: %+v", first.EffectivePrefillTokens, loadOf(r, first.WorkerID, first.DPRank))
	}
	h.PrefillDone()
	h.PrefillDone()
	if l := loadOf(r, first.WorkerID, first.DPRank); l.PotentialPrefillTokens != 0 || l.ActiveRequests != 1 {
		t.Fatalf("after PrefillDone: %+v", l)
	}
	if err := h.OutputBlock(ptr(0.5)); err != nil {
		t.Fatal(err)
	}
	if err := h.OutputBlock(ptr(2.0)); StatusOf(err) != 400 {
		t.Fatalf("decay 2: %v", err)
	}
	seen := []Rank{{first.WorkerID, first.DPRank}}
	for range len(ranks) - 1 {
		if !h.Failed() {
			t.Fatalf("failover after %v: none", seen)
		}
		resp := h.Response()
		rk := Rank{resp.WorkerID, resp.DPRank}
		if slices.Contains(seen, rk) {
			t.Fatalf("rank %v booked again after %v", rk, seen)
		}
		seen = append(seen, rk)
		if len(resp.Candidates) != len(ranks)-len(seen)+1 {
			t.Fatalf("failover %d: %d candidates", len(seen)-1, len(resp.Candidates))
		}
		if l := loadOf(r, rk.WorkerID, rk.DPRank); l.PotentialPrefillTokens != resp.EffectivePrefillTokens || r.ActiveReservations() != 1 {
			t.Fatalf("after failover to %v: %+v, %d reservations", rk, l, r.ActiveReservations())
		}
	}
	if h.Failed() || h.Response() != nil || h.Target() != "" || r.ActiveReservations() != 0 {
		t.Fatalf("past the last rank: %v %v %d", h.Response(), h.Target(), r.ActiveReservations())
	}
	if err := h.OutputBlock(nil); StatusOf(err) != 404 {
		t.Fatalf("OutputBlock on an empty handle: %v", err)
	}
	h.PrefillDone()
	h.Answered(200)
	h.Release()
	h.Release()
	if r.ActiveReservations() != 0 {
		t.Fatalf("%d reservations left", r.ActiveReservations())
	}
}

// TestReservationReleaseEndsIt: after Release nothing books or frees
// again, and the caller's request is left as it was.
func TestReservationReleaseEndsIt(t *testing.T) {
	r, _ := reservationRouter(t)
	exclude := []Rank{{1, 0}}
	req := &SelectRequest{Prompt: promptOf(rand.New(rand.NewPCG(2, 2))), Placement: Placement{ExcludeRanks: exclude}}
	l := &tracingLedger{inner: (*routerLedger)(r)}
	h, err := reserve(l, req, false)
	if err != nil {
		t.Fatal(err)
	}
	if !h.Failed() {
		t.Fatal("no failover")
	}
	h.Answered(503)
	h.Release()
	if h.Failed() || r.ActiveReservations() != 0 {
		t.Fatalf("Failed after Release booked: %d reservations", r.ActiveReservations())
	}
	h.PrefillDone()
	if err := h.OutputBlock(nil); err == nil {
		t.Fatal("OutputBlock after Release succeeded")
	}
	if h.Response() == nil {
		t.Fatal("Response forgot the booking held last")
	}
	if req.SelectionID != "" || !slices.Equal(req.Placement.ExcludeRanks, []Rank{{1, 0}}) || len(exclude) != 1 {
		t.Fatalf("the caller's request changed: %q %v", req.SelectionID, req.Placement.ExcludeRanks)
	}
	if err := checkLifecycle(l.log); err != nil {
		t.Fatal(err)
	}
	if got := len(l.log); got != 6 { // reserve, failure, free, reserve, status, free
		t.Fatalf("%d calls: %+v", got, l.log)
	}
}

// TestReservationPropertyMatchesModel runs random calls on a few handles,
// one at a time, against a model of what each holds: after every step the
// router's reservations, and each rank's requests and prefill tokens,
// must be the model's; every handle's log must keep the lifecycle.
func TestReservationPropertyMatchesModel(t *testing.T) {
	r, ranks := reservationRouter(t)
	rng := rand.New(rand.NewPCG(17, 19))
	type model struct {
		h         *Reservation
		l         *tracingLedger
		resp      *SelectResponse // nil: holds nothing
		prefilled bool
	}
	var live []*model
	var logs [][]ledgerCall
	for step := range 3000 {
		if len(live) < 2 || rng.IntN(8) == 0 {
			l := &tracingLedger{inner: (*routerLedger)(r)}
			h, err := reserve(l, &SelectRequest{Prompt: promptOf(rng), RecordOnAnswer: rng.IntN(2) == 0}, false)
			if err != nil {
				t.Fatal(err)
			}
			live = append(live, &model{h: h, l: l, resp: h.Response()})
		}
		i := rng.IntN(len(live))
		m := live[i]
		switch op := rng.IntN(10); {
		case op < 2:
			m.h.PrefillDone()
			m.prefilled = m.prefilled || m.resp != nil
		case op < 4:
			m.h.Answered([]int{200, 429, 502, 503, 504}[rng.IntN(5)])
		case op < 5:
			err := m.h.OutputBlock(nil)
			if (err == nil) != (m.resp != nil) {
				t.Fatalf("step %d: OutputBlock: %v, holding %v", step, err, m.resp != nil)
			}
		case op < 8:
			ok := m.h.Failed()
			if m.resp == nil && ok {
				t.Fatalf("step %d: an empty handle failed over", step)
			}
			m.resp, m.prefilled = nil, false
			if ok {
				m.resp = m.h.Response()
			}
		default:
			m.h.Release()
			m.resp = nil
			logs = append(logs, m.l.log)
			live = slices.Delete(live, i, i+1)
		}
		if got := m.h.Response(); m.resp != nil && got != m.resp {
			t.Fatalf("step %d: the handle holds %v, model %v", step, got, m.resp)
		}
		held := 0
		requests, prefill := map[Rank]uint64{}, map[Rank]uint64{}
		for _, m := range live {
			if m.resp != nil {
				held++
				rk := Rank{m.resp.WorkerID, m.resp.DPRank}
				requests[rk]++
				if !m.prefilled {
					prefill[rk] += m.resp.EffectivePrefillTokens
				}
			}
		}
		if r.ActiveReservations() != held {
			t.Fatalf("step %d: %d reservations, model %d", step, r.ActiveReservations(), held)
		}
		for _, rk := range ranks {
			l := loadOf(r, rk.WorkerID, rk.DPRank)
			if l.ActiveRequests != requests[rk] || l.PotentialPrefillTokens != prefill[rk] {
				t.Fatalf("step %d rank %v: %d requests, %d prefill tokens; model %d, %d",
					step, rk, l.ActiveRequests, l.PotentialPrefillTokens, requests[rk], prefill[rk])
			}
		}
	}
	for _, m := range live {
		m.h.Release()
		logs = append(logs, m.l.log)
	}
	if r.ActiveReservations() != 0 {
		t.Fatalf("%d reservations after every release", r.ActiveReservations())
	}
	for i, log := range logs {
		if err := checkLifecycle(log); err != nil {
			t.Fatalf("handle %d: %v", i, err)
		}
	}
}

// TestReservationPropertyConcurrent calls every method of each handle from
// several goroutines at once, in random order (run it with -race), while
// a watcher reads the router's counts: no rank ever holds more bookings
// than there are handles or an underflowed prefill count, every handle's
// log keeps the lifecycle, and when all are released nothing is left.
func TestReservationPropertyConcurrent(t *testing.T) {
	r, _ := reservationRouter(t)
	const handles, callers, calls = 200, 4, 30
	stop := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if n := r.ActiveReservations(); n < 0 || n > handles {
				t.Errorf("%d reservations", n)
				return
			}
			for _, m := range r.Queries().Loads("", "") {
				for _, l := range m.Loads {
					if l.ActiveRequests > handles || l.PotentialPrefillTokens > 1<<32 {
						t.Errorf("rank %d/%d: %+v", l.WorkerID, l.DPRank, l)
						return
					}
				}
			}
		}
	})
	var wg sync.WaitGroup
	ledgers := make([]*tracingLedger, handles)
	for i := range handles {
		ledgers[i] = &tracingLedger{inner: (*routerLedger)(r)}
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 3))
			h, err := reserve(ledgers[i], &SelectRequest{Prompt: promptOf(rng), RecordOnAnswer: i%3 == 0}, i%2 == 0)
			if err != nil {
				t.Error(err)
				return
			}
			var inner sync.WaitGroup
			for c := range callers {
				inner.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(i), uint64(c)))
					for range calls {
						switch rng.IntN(9) {
						case 0, 1:
							h.PrefillDone()
						case 2:
							h.Answered([]int{200, 429, 503}[rng.IntN(3)])
						case 3:
							_ = h.OutputBlock(ptr(rng.Float64()))
						case 4:
							_ = h.Failed()
						case 5:
							if rng.IntN(4) == 0 {
								h.Release()
							}
						default:
							_, _ = h.Response(), h.Target()
						}
					}
				})
			}
			inner.Wait()
			h.Release()
		})
	}
	wg.Wait()
	close(stop)
	watch.Wait()
	if n := r.ActiveReservations(); n != 0 {
		t.Fatalf("%d reservations after every release", n)
	}
	for _, m := range r.Queries().Loads("", "") {
		for _, l := range m.Loads {
			if l.ActiveRequests != 0 || l.PotentialPrefillTokens != 0 || l.PotentialDecodeBlocks != 0 {
				t.Fatalf("load left behind: %+v", l)
			}
		}
	}
	failovers := 0
	for i, l := range ledgers {
		if err := checkLifecycle(l.log); err != nil {
			t.Fatalf("handle %d: %v", i, err)
		}
		for _, c := range l.log[1:] {
			if c.op == "reserve" {
				failovers++
			}
		}
	}
	if failovers == 0 {
		t.Fatal("no handle failed over")
	}
	t.Logf("%d failovers", failovers)
}

// BenchmarkReservation is a proxied request's lifecycle through the handle
// against the same calls made on the router directly.
func BenchmarkReservation(b *testing.B) {
	r := benchRouter(b, 8)
	prompt := promptOf(rand.New(rand.NewPCG(1, 2)))
	b.Run("handle", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			h, err := r.Reserve(&SelectRequest{Prompt: prompt, Lean: true}, false)
			if err != nil {
				b.Fatal(err)
			}
			_ = h.Target()
			h.Answered(200)
			h.PrefillDone()
			h.PrefillDone()
			h.Release()
		}
	})
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			req := &SelectRequest{Prompt: prompt, Lean: true}
			resp, err := r.SelectAndReserve(req)
			if err != nil {
				b.Fatal(err)
			}
			_ = HostPort(resp.Endpoint)
			r.Health().ReportStatus(resp.WorkerID, 200)
			_ = r.PrefillComplete(resp.SelectionID)
			_ = r.Free(resp.SelectionID)
		}
	})
}

// A proxied request for a model no worker serves is a 404 (in vLLM's
// words), never a booking on another model's worker; a served model with
// no schedulable worker is the 503 a selection gets. Deleting the model's
// last worker makes it unknown again.
func TestReserveRefusesUnservedModels(t *testing.T) {
	r := newTestRouter(t, nil)
	addWorker(t, r, 1, func(w *WorkerRequest) { w.ModelName = ptr("m") })
	addWorker(t, r, 2, func(w *WorkerRequest) { w.ModelName = ptr("half"); w.Endpoint = nil })
	reserve := func(model string) error {
		h, err := r.Reserve(&SelectRequest{Partition: Partition{ModelName: model}, Prompt: Prompt{TokenIDs: make([]uint32, 32)}}, false)
		if err == nil {
			h.Release()
		}
		return err
	}
	if err := reserve("m"); err != nil {
		t.Fatal(err)
	}
	mustStatus(t, reserve("other"), 404, "The model `other` does not exist.")
	mustStatus(t, reserve("half"), 503, "no schedulable workers")
	if _, err := r.Catalog().DeleteWorker(1); err != nil {
		t.Fatal(err)
	}
	mustStatus(t, reserve("m"), 404, "does not exist")
}

// TestRecordOnAnswer: in approximate mode a booking made with
// RecordOnAnswer (the proxy's) is recorded as cached on its rank once the
// worker answers 2xx, not when it is booked: a rank that failed over, or a
// worker's 400 (a prompt the engine refused) or 503, records nothing.
func TestRecordOnAnswer(t *testing.T) {
	r, _ := reservationRouter(t)
	held := func() map[uint64]int {
		out := map[uint64]int{}
		for _, d := range r.Queries().Dump() {
			for _, ev := range d.Events {
				out[ev.WorkerID]++
			}
		}
		return out
	}
	rng := rand.New(rand.NewPCG(5, 5))
	for _, status := range []int{400, 503, 429} {
		h, err := r.Reserve(&SelectRequest{Prompt: promptOf(rng), Lean: true, RecordOnAnswer: true}, false)
		if err != nil {
			t.Fatal(err)
		}
		h.Answered(status)
		h.Release()
		if got := held(); len(got) != 0 {
			t.Fatalf("after a %d: the index holds %v, want nothing", status, got)
		}
	}
	h, err := r.Reserve(&SelectRequest{Prompt: Prompt{TokenIDs: make([]uint32, 64)}, Lean: true, RecordOnAnswer: true}, false)
	if err != nil {
		t.Fatal(err)
	}
	failed := h.Response().WorkerID
	if len(held()) != 0 {
		t.Fatal("recorded on booking")
	}
	if !h.Failed() {
		t.Fatal("no rank to fail over to")
	}
	answered := h.Response().WorkerID
	h.Answered(200)
	h.Answered(200) // once
	if len(held()) != 0 {
		t.Fatal("recorded on the status, before the first byte")
	}
	h.PrefillDone()
	h.Release()
	got := held()
	if len(got) != 1 || got[answered] != 4 || got[failed] != 0 && failed != answered {
		t.Fatalf("held %v: want the 4 blocks on the rank that answered (%d), none on the one that failed (%d)", got, answered, failed)
	}
	// A 200 whose first byte never came (vLLM sends a stream's headers
	// before its engine takes the request; the client left) records
	// nothing; a first byte before the status does not record either
	// until the status is 2xx.
	h, err = r.Reserve(&SelectRequest{Prompt: Prompt{TokenIDs: seqPrompt(64, 1000)}, Lean: true, RecordOnAnswer: true}, false)
	if err != nil {
		t.Fatal(err)
	}
	h.Answered(200)
	h.Release()
	h.PrefillDone() // after Release: nothing
	if got := held(); len(got) != 1 || got[answered] != 4 {
		t.Fatalf("a stream left after its headers was recorded: %v", got)
	}
	h, err = r.Reserve(&SelectRequest{Prompt: Prompt{TokenIDs: seqPrompt(64, 2000)}, Lean: true, RecordOnAnswer: true}, false)
	if err != nil {
		t.Fatal(err)
	}
	h.PrefillDone()
	if n := sum(held()); n != 4 {
		t.Fatalf("recorded on the first byte alone: %d blocks held", n)
	}
	h.Answered(200)
	h.Release()
	if n := sum(held()); n != 8 {
		t.Fatalf("a 200 after the first byte: %d blocks held, want 8", n)
	}
	// Without it (the selection API), a booking is recorded at once.
	if _, err := r.SelectAndReserve(&SelectRequest{Prompt: Prompt{TokenIDs: make([]uint32, 64)}, Placement: Placement{ExcludeRanks: []Rank{{WorkerID: answered}}}}); err != nil {
		t.Fatal(err)
	}
	if n := sum(held()); n != 12 {
		t.Fatalf("the selection API's booking was not recorded on booking: %d blocks held, want 12", n)
	}
}

// seqPrompt is n token ids counting up from first.
func seqPrompt(n int, first uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = first + uint32(i)
	}
	return out
}

// sum adds up the blocks held per worker.
func sum(held map[uint64]int) int {
	n := 0
	for _, v := range held {
		n += v
	}
	return n
}
