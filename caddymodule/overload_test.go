package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

func TestOverloadSettingsDefaultsAndClasses(t *testing.T) {
	s, err := (*OverloadConfig)(nil).settings()
	if err != nil {
		t.Fatal(err)
	}
	if s.off || s.queueSize != 1024 || s.maxWait != 5*time.Second || s.priorityHeader != "X-Priority" ||
		s.busyFor != time.Second || s.busyMax != 10*time.Second {
		t.Fatalf("defaults: %+v", s)
	}
	for value, want := range map[string]int{"high": 0, "normal": 1, "low": 2, "": 1, "HIGH": 1, "critical": 1} {
		if got := s.class(value); got != want {
			t.Errorf("class(%q) = %d, want %d", value, got, want)
		}
	}
	s, err = (&OverloadConfig{PriorityClasses: []string{"gold", "silver", "bronze"}}).settings()
	if err != nil || s.class("platinum") != 2 {
		t.Fatalf("custom classes: the default must be the last: %+v %v", s, err)
	}
	for _, bad := range []OverloadConfig{
		{QueueSize: -1}, {QueueSize: maxQueueSize + 1}, {MaxWait: -1},
		{PriorityClasses: []string{"a", "a"}}, {PriorityClasses: []string{"a", ""}},
		{DefaultPriority: "urgent"}, {PriorityClasses: []string{"a"}, DefaultPriority: "normal"},
		{WorkerBusyFor: 20e9}, {WorkerBusyFor: 3e9, WorkerBusyMax: 2e9},
	} {
		if _, err := bad.settings(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestOverloadCaddyfile(t *testing.T) {
	var h Handler
	d := caddyfile.NewTestDispenser(`kv_router {
		overload {
			queue_size 10
			max_wait 250ms
			priority_header X-Tier
			priority_classes gold silver
			default_priority silver
			worker_busy_for 2s
			worker_busy_max 30s
		}
	}`)
	if err := h.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	o := h.Overload
	if o.Off || o.QueueSize != 10 || time.Duration(o.MaxWait) != 250*time.Millisecond || o.PriorityHeader != "X-Tier" ||
		strings.Join(o.PriorityClasses, ",") != "gold,silver" || o.DefaultPriority != "silver" ||
		time.Duration(o.WorkerBusyFor) != 2*time.Second || time.Duration(o.WorkerBusyMax) != 30*time.Second {
		t.Fatalf("parsed %+v", o)
	}
	// The JSON it adapts to says the same.
	b, err := json.Marshal(&h)
	if err != nil {
		t.Fatal(err)
	}
	var back Handler
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back.Overload, h.Overload) {
		t.Fatalf("JSON %s round-trips to %+v (%v)", b, back.Overload, err)
	}
	h = Handler{}
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("kv_router {\n overload off\n}")); err != nil || !h.Overload.Off {
		t.Fatalf("overload off: %+v %v", h.Overload, err)
	}
	for _, bad := range []string{"overload on", "overload {\n bogus 1\n}", "overload {\n priority_classes\n}"} {
		h = Handler{}
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("kv_router {\n" + bad + "\n}")); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// A newcomer that, at the rate the line has been admitting requests,
// would wait past max_wait is refused on arrival.
func TestOverloadPredictedWaitSheds(t *testing.T) {
	s, _ := (&OverloadConfig{MaxWait: 1_000_000_000}).settings()
	q := newOverloadQueue(s, func(selection.Partition, *selection.Placement) (bool, bool) { return true, true })
	now := time.Unix(1000, 0)
	q.now = func() time.Time { return now }
	key := selection.PartitionKey{Model: "m"}
	q.mu.Lock()
	line := q.lineLocked(key)
	q.mu.Unlock()
	for i := range 10 { // ten admissions a second, the line never empty
		line.gaps[i] = 100 * time.Millisecond
	}
	line.nGaps, line.lastAdmit = 10, now
	for i := range 5 {
		if r := q.enqueue(key, &waiter{class: 1, wake: make(chan struct{}, 1)}, now); r != "" {
			t.Fatalf("waiter %d (predicted wait %v) refused: %s", i, time.Duration(i+1)*100*time.Millisecond, r)
		}
	}
	// The fifth waits 0.5 s, predictMargin of max_wait; the sixth would
	// wait 0.6 s.
	if r := q.enqueue(key, &waiter{class: 1, wake: make(chan struct{}, 1)}, now); r != shedPredictedWait {
		t.Fatalf("the sixth: %q, want predicted_wait", r)
	}
	// A higher class waits only behind its own and higher: it may wait.
	if r := q.enqueue(key, &waiter{class: 0, wake: make(chan struct{}, 1)}, now); r != "" {
		t.Fatalf("a high-class newcomer refused: %s", r)
	}
	// After an idle spell the old rate says nothing: no prediction.
	if r := q.enqueue(key, &waiter{class: 1, wake: make(chan struct{}, 1)}, now.Add(2*time.Second)); r != "" {
		t.Fatalf("refused on a stale rate: %s", r)
	}
}

// On sparse traffic the line empties at each admission, and the gaps
// between admissions are the clients' pauses, not the workers' pace: a
// newcomer is not refused on them. Requests 2.7 s apart on one worker,
// each waiting 0.2 s, made a rate of 0.37 a second, and the next was
// refused as if it would wait 2.7 s (over half of max_wait's 5 s). The
// rate reads the waits: 5 a second here, and under overload the pace at
// which places free.
func TestOverloadSparseTrafficIsNotShed(t *testing.T) {
	s, _ := (&OverloadConfig{}).settings() // max_wait 5s
	var busy atomic.Bool
	q := newOverloadQueue(s, func(selection.Partition, *selection.Placement) (bool, bool) { return busy.Load(), true })
	now := time.Unix(1000, 0)
	q.now = func() time.Time { return now }
	key := selection.PartitionKey{Model: "m"}
	lr := lineRequest{part: selection.Partition{ModelName: "m"}}
	for i := range 12 {
		busy.Store(true)
		w := &waiter{class: 1, wake: make(chan struct{}, 1), req: lr}
		if r := q.enqueue(key, w, now); r != "" {
			t.Fatalf("request %d, 2.7 s after the one before, refused: %s", i, r)
		}
		now = now.Add(200 * time.Millisecond)
		busy.Store(false)
		q.dispatch(key)
		if !q.isAdmitted(w) {
			t.Fatalf("request %d not admitted once its worker was free", i)
		}
		q.settled(key)
		now = now.Add(2500 * time.Millisecond)
	}
	// Under real overload the line stays backlogged: two waiters at a time,
	// a place every 100 ms (a window's worth, so that the sparse requests'
	// waits have left it).
	for range rateWindow + 8 {
		busy.Store(true)
		for range 2 {
			q.enqueue(key, &waiter{class: 1, wake: make(chan struct{}, 1), req: lr}, now)
		}
		busy.Store(false)
		q.dispatch(key)
		busy.Store(true) // the admitted one took the place
		q.settled(key)
		now = now.Add(100 * time.Millisecond)
	}
	if r := q.rateOf(key); r < 9 || r > 11 {
		t.Fatalf("a backlogged line's rate %.2f a second, want 10", r)
	}
}

// rateOf is key's line's admission rate now.
func (q *overloadQueue) rateOf(key selection.PartitionKey) float64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.lines[key].rate(q.now(), q.s.maxWait)
}

// Cleanup refuses the waiting requests and later ones.
func TestOverloadCloseReleasesWaiters(t *testing.T) {
	s, _ := (&OverloadConfig{}).settings()
	var busy atomic.Bool
	busy.Store(true)
	q := newOverloadQueue(s, func(selection.Partition, *selection.Placement) (bool, bool) { return busy.Load(), true })
	part := selection.Partition{ModelName: "m"}
	done := make(chan admission)
	go func() { done <- q.wait(context.Background(), lineRequest{part: part}, 1) }()
	for q.depth(part.Key()) == 0 {
		time.Sleep(time.Millisecond)
	}
	q.close()
	if a := <-done; a.shed != shedClosing || !a.queued {
		t.Fatalf("a waiter at close: %+v", a)
	}
	if q.depth(part.Key()) != 0 {
		t.Fatal("the closed queue still holds a waiter")
	}
	if a := q.wait(context.Background(), lineRequest{part: part}, 1); a.shed != shedClosing {
		t.Fatalf("a request after close: %+v", a)
	}
	busy.Store(false)
	if a := q.wait(context.Background(), lineRequest{part: part}, 1); a.shed != "" || a.queued {
		t.Fatalf("with capacity, even a closed queue lets requests go straight on: %+v", a)
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"": 0, "3": 3 * time.Second, " 0 ": 0, "-1": 0, "soon": 0,
		now.Add(5 * time.Second).Format(http.TimeFormat): 5 * time.Second,
		now.Add(-time.Hour).Format(http.TimeFormat):      0,
	} {
		if got := parseRetryAfter(v, now); got != want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", v, got, want)
		}
	}
	for _, c := range []struct {
		status int
		ra     string
		busy   bool
	}{{429, "", true}, {503, "2", true}, {503, "", false}, {502, "2", false}, {200, "2", false}} {
		h := http.Header{}
		if c.ra != "" {
			h.Set("Retry-After", c.ra)
		}
		if busy, _ := overloadedAnswer(c.status, h); busy != c.busy {
			t.Errorf("status %d Retry-After %q: busy %v", c.status, c.ra, busy)
		}
	}
}

// A partition found not busy is not asked again for clearFor; one the
// router does not know gets no line.
func TestOverloadFastPathAsksSparingly(t *testing.T) {
	s, _ := (&OverloadConfig{}).settings()
	var asked atomic.Int64
	q := newOverloadQueue(s, func(p selection.Partition, _ *selection.Placement) (bool, bool) {
		asked.Add(1)
		return false, p.ModelName == "m" && p.RoutingGroup == ""
	})
	now := time.Unix(1000, 0)
	q.now = func() time.Time { return now }
	served := selection.Partition{ModelName: "m"}
	for range 3 {
		if a := q.wait(context.Background(), lineRequest{part: served}, 1); a.queued || a.shed != "" {
			t.Fatalf("an idle partition: %+v", a)
		}
	}
	if asked.Load() != 1 {
		t.Fatalf("asked the router %d times within clearFor", asked.Load())
	}
	now = now.Add(clearFor)
	q.wait(context.Background(), lineRequest{part: served}, 1)
	if asked.Load() != 2 {
		t.Fatalf("not asked again after clearFor: %d", asked.Load())
	}
	for i := range 100 {
		q.wait(context.Background(), lineRequest{part: selection.Partition{ModelName: "m", RoutingGroup: strconv.Itoa(i)}}, 1)
	}
	if len(q.lines) != 1 {
		t.Fatalf("%d lines: unknown partitions got lines", len(q.lines))
	}
}

// reserved is what a booking through the handler's queue came to.
type reserved struct {
	res      *selection.Reservation
	err      error
	answered bool // refused through the queue (429)
}

// reserveThrough books an 8-token prompt through h's queue as the handler
// does, allowed (nil: any worker) in scope.
func reserveThrough(h *Handler, allowed map[uint64]bool, scope lineScope) reserved {
	return reserveAs(h, allowed, scope, "")
}

// reserveAs is reserveThrough with a priority class.
func reserveAs(h *Handler, allowed map[uint64]bool, scope lineScope, priority string) reserved {
	req := &selection.SelectRequest{Prompt: selection.Prompt{TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8}},
		Placement: selection.Placement{AllowedSet: allowed}}
	r := httptest.NewRequest(http.MethodPost, "/v1/completions", nil)
	if priority != "" {
		r.Header.Set("X-Priority", priority)
	}
	res, _, answered, err := h.reserve(httptest.NewRecorder(), r, req, scope, "kv")
	return reserved{res, err, answered}
}

// waiting starts book in the background and returns once it waits in h's
// queue (the default partition's), failing the test if it ends instead.
func waiting(t *testing.T, h *Handler, book func() reserved) <-chan reserved {
	t.Helper()
	done := make(chan reserved, 1)
	go func() { done <- book() }()
	for h.queue.depth((&selection.Partition{}).Key()) == 0 {
		select {
		case o := <-done:
			t.Fatalf("the request did not wait: %v (answered %v)", o.err, o.answered)
		case <-time.After(time.Millisecond):
		}
	}
	return done
}

// A request that went straight on, on a not-busy answer still reused,
// and found every worker full waits in the queue instead of getting 503,
// and books the worker once it frees.
func TestOverloadStaleClearRequeues(t *testing.T) {
	id, endpoint, bs := uint64(1), "127.0.0.1:9", uint32(4)
	router := routerWith(t, func(c *selection.Config) { c.MaxReservationsPerRank = 1 },
		selection.WorkerRequest{WorkerID: &id, Endpoint: &endpoint, BlockSize: &bs})
	s, _ := (&OverloadConfig{}).settings()
	h := &Handler{router: router, overload: s, queue: newOverloadQueue(s, router.PartitionBusy)}
	h.queue.clearFor = time.Hour // the first answer is reused throughout
	first := reserveThrough(h, nil, lineScope{})
	if first.err != nil || first.answered {
		t.Fatalf("first request: %v %v", first.err, first.answered)
	}
	second := waiting(t, h, func() reserved { return reserveThrough(h, nil, lineScope{}) })
	first.res.Release()
	h.kickQueue(selection.Partition{})
	o := <-second
	if o.err != nil || o.answered || o.res == nil {
		t.Fatalf("the waiting request: %v (answered %v)", o.err, o.answered)
	}
	o.res.Release()
}

// A request that may go only to some workers (a long prompt to those
// whose context fits it) waits for them when they are full, however idle
// the others: the queue asked about the whole partition, let it go on
// and it got a 503 (helper-54's probe: four of six long requests). A
// request any worker may take is not held up behind it.
func TestOverloadNarrowedRequestWaitsForItsWorkers(t *testing.T) {
	endpoint, bs := "127.0.0.1:9", uint32(4)
	worker := func(id uint64) selection.WorkerRequest {
		ep := fmt.Sprintf("%s%d", endpoint, id)
		return selection.WorkerRequest{WorkerID: &id, Endpoint: &ep, BlockSize: &bs}
	}
	router := routerWith(t, func(c *selection.Config) { c.MaxReservationsPerRank = 1 }, worker(1), worker(2))
	s, _ := (&OverloadConfig{}).settings()
	h := &Handler{router: router, overload: s, queue: newOverloadQueue(s, router.PartitionBusy)}
	onlyTwo := map[uint64]bool{2: true}
	scope := lineScope{context: 65536}
	first := reserveThrough(h, onlyTwo, scope)
	if first.err != nil || first.answered {
		t.Fatalf("first long request: %v %v", first.err, first.answered)
	}
	second := waiting(t, h, func() reserved { return reserveThrough(h, onlyTwo, scope) })
	short := reserveThrough(h, nil, lineScope{})
	if short.err != nil || short.answered || short.res.Response().WorkerID != 1 {
		t.Fatalf("a short request behind the waiting long one: %v (answered %v)", short.err, short.answered)
	}
	short.res.Release()
	first.res.Release()
	h.kickQueue(selection.Partition{})
	o := <-second
	if o.err != nil || o.answered || o.res == nil || o.res.Response().WorkerID != 2 {
		t.Fatalf("the waiting long request: %v (answered %v)", o.err, o.answered)
	}
	o.res.Release()
}

// The line orders every waiter of the partition, whatever workers it may
// go to: a place freed on worker 2 goes to the first waiter, by class
// then arrival, that may take it (a long prompt of a higher class before
// a short one of a lower class that came first), and a place on worker 1
// to a waiter that may go there, not held up behind the long one. Lines
// per scope let a short request of a lower class take worker 2 before a
// long one waiting for it, and let a long one that came later pass the
// partition's line (helper-57's probe, with max_tokens raised to pass).
func TestOverloadLineServesEveryScopeInOrder(t *testing.T) {
	worker := func(id uint64) selection.WorkerRequest {
		ep, bs := fmt.Sprintf("127.0.0.1:9%d", id), uint32(4)
		return selection.WorkerRequest{WorkerID: &id, Endpoint: &ep, BlockSize: &bs}
	}
	router := routerWith(t, func(c *selection.Config) { c.MaxReservationsPerRank = 1 }, worker(1), worker(2))
	s, _ := (&OverloadConfig{}).settings()
	h := &Handler{router: router, overload: s, queue: newOverloadQueue(s, router.PartitionBusy)}
	onlyTwo, long := map[uint64]bool{2: true}, lineScope{context: 65536}
	one, two := reserveThrough(h, map[uint64]bool{1: true}, long), reserveThrough(h, onlyTwo, long)
	if one.err != nil || two.err != nil {
		t.Fatalf("filling both workers: %v, %v", one.err, two.err)
	}
	short := waiting(t, h, func() reserved { return reserveAs(h, nil, lineScope{}, "low") })
	longer := make(chan reserved, 1)
	go func() { longer <- reserveAs(h, onlyTwo, long, "high") }()
	for h.queue.depth((&selection.Partition{}).Key()) < 2 {
		time.Sleep(time.Millisecond)
	}
	two.res.Release()
	h.kickQueue(selection.Partition{})
	got := <-longer
	if got.err != nil || got.answered || got.res.Response().WorkerID != 2 {
		t.Fatalf("the high long request, worker 2 freed: %v (answered %v)", got.err, got.answered)
	}
	select {
	case o := <-short:
		t.Fatalf("the low short request went on with every worker full: %v (answered %v)", o.err, o.answered)
	case <-time.After(50 * time.Millisecond):
	}
	one.res.Release()
	h.kickQueue(selection.Partition{})
	o := <-short
	if o.err != nil || o.answered || o.res.Response().WorkerID != 1 {
		t.Fatalf("the low short request, worker 1 freed: %v (answered %v)", o.err, o.answered)
	}
	o.res.Release()
	got.res.Release()
}

// queue_size bounds the waiters of a partition, whatever workers each
// may go to (per line of a scope, a client choosing its scope by its
// max_tokens or an adapter had lines times queue_size).
func TestOverloadQueueSizeIsThePartitions(t *testing.T) {
	s, _ := (&OverloadConfig{QueueSize: 2}).settings()
	q := newOverloadQueue(s, func(selection.Partition, *selection.Placement) (bool, bool) { return true, true })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan admission, 2)
	for i := range 2 {
		go func() { done <- q.wait(ctx, lineRequest{scope: lineScope{context: uint64(1000 * (i + 1))}}, 1) }()
	}
	for q.depth((&selection.Partition{}).Key()) < 2 {
		time.Sleep(time.Millisecond)
	}
	if a := q.wait(ctx, lineRequest{scope: lineScope{adapter: "a"}}, 1); a.shed != shedQueueFull {
		t.Fatalf("a third waiter, of a third scope, past queue_size 2: %+v", a)
	}
	cancel()
	<-done
	<-done
}

// Each refusal says why: a predicted wait is not a full queue (it said
// so, helper-57's probe).
func TestShedMessagesSayWhy(t *testing.T) {
	wait := 5 * time.Second
	seen := map[string]shedReason{}
	for _, r := range []shedReason{shedQueueFull, shedPredictedWait, shedDeadline, shedClosing} {
		m := shedMessage(r, wait)
		if other, dup := seen[m]; dup {
			t.Errorf("%s and %s say the same: %q", r, other, m)
		}
		seen[m] = r
	}
	if m := shedMessage(shedPredictedWait, wait); strings.Contains(m, "full") || !strings.Contains(m, "5s") {
		t.Errorf("predicted wait: %q", m)
	}
}
