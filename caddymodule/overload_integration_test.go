package caddymodule

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// overloadWorker is a test worker whose completions the test controls: a
// request tagged "hold" (X-Test-Tag) waits at the worker until release
// closes, so it keeps its reservation; every other one answers at once.
// The tags reach the worker in the order the gateway sent them.
type overloadWorker struct {
	*testWorker
	release chan struct{}
	held    chan struct{} // one value per "hold" request that arrived

	mu   sync.Mutex
	tags []string
	// answer, when set, answers untagged requests instead (an overloaded
	// worker).
	answer func(http.ResponseWriter)
}

func newOverloadWorker(t *testing.T, id uint64) *overloadWorker {
	ow := &overloadWorker{release: make(chan struct{}), held: make(chan struct{}, 16)}
	ow.testWorker = startTestWorker(t, id, func(w *testWorker) {
		w.hold = func(rw http.ResponseWriter, r *http.Request) bool {
			tag := r.Header.Get("X-Test-Tag")
			ow.mu.Lock()
			ow.tags = append(ow.tags, tag)
			answer := ow.answer
			ow.mu.Unlock()
			if tag == "hold" {
				ow.held <- struct{}{}
				select {
				case <-ow.release:
				case <-r.Context().Done():
					return true
				}
			} else if answer != nil {
				answer(rw)
				return true
			}
			rw.Header().Set("Content-Type", "application/json")
			fmt.Fprint(rw, `{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":8}}`)
			return true
		}
	})
	t.Cleanup(func() {
		select {
		case <-ow.release:
		default:
			close(ow.release)
		}
	})
	return ow
}

func (ow *overloadWorker) sentTags() []string {
	ow.mu.Lock()
	defer ow.mu.Unlock()
	return append([]string(nil), ow.tags...)
}

// overloadCaddyfile is proxyCaddyfile with one worker that takes one
// request at a time (max_reservations_per_worker 1: it is busy while it
// holds one), and the handler's overload block.
func overloadCaddyfile(w *testWorker, appLines, overload string) string {
	cfg := proxyCaddyfile("\t\tmax_reservations_per_worker 1\n" + appLines + workerBlock(w))
	return strings.Replace(cfg, "\t\ttokenize_timeout 2s\n", "\t\ttokenize_timeout 2s\n"+overload, 1)
}

type overloadResult struct {
	status     int
	retryAfter string
	body       string
	took       time.Duration
	err        error
}

// send posts a completion tagged tag (and with priority, when not empty).
func send(ctx context.Context, tester *testCaddy, tag, priority string) overloadResult {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, apiBase+"/v1/completions",
		strings.NewReader(`{"model":"m","prompt":[1,2,3,4,5,6,7,8],"max_tokens":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Test-Tag", tag)
	if priority != "" {
		req.Header.Set("X-Priority", priority)
	}
	start := time.Now()
	res, err := tester.Client.Do(req)
	if err != nil {
		return overloadResult{err: err, took: time.Since(start)}
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return overloadResult{status: res.StatusCode, retryAfter: res.Header.Get("Retry-After"), body: string(body), took: time.Since(start)}
}

// sendAsync sends in the background; the result arrives on the channel.
func sendAsync(ctx context.Context, tester *testCaddy, tag, priority string) <-chan overloadResult {
	ch := make(chan overloadResult, 1)
	go func() { ch <- send(ctx, tester, tag, priority) }()
	return ch
}

// metricValue is a gauge's or counter's value.
func metricValue(m prometheus.Metric) float64 {
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		panic(err)
	}
	if out.Gauge != nil {
		return out.Gauge.GetValue()
	}
	return out.Counter.GetValue()
}

// waitDepth waits until model m's overload queue holds n requests.
func waitDepth(t *testing.T, n int) {
	t.Helper()
	waitMetric(t, "overload queue depth", func() float64 { return metricValue(queueDepth.WithLabelValues("m")) }, float64(n))
}

// waitMetric waits until get, a metric's value, is want: metrics move
// after the work they count, which a test cannot always wait on.
func waitMetric(t *testing.T, what string, get func() float64, want float64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if got := get(); got == want {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("%s %v, want %v", what, got, want)
		}
	}
}

// holdWorker sends a request that the worker holds, and waits until it
// is there: the worker is then busy.
func holdWorker(t *testing.T, tester *testCaddy, ow *overloadWorker) <-chan overloadResult {
	t.Helper()
	ch := sendAsync(context.Background(), tester, "hold", "")
	select {
	case <-ow.held:
	case r := <-ch:
		t.Fatalf("the held request ended: %+v", r)
	case <-time.After(5 * time.Second):
		t.Fatal("the held request did not reach the worker")
	}
	return ch
}

func shedCount(reason string) float64 {
	return metricValue(queueShedTotal.WithLabelValues("m", reason))
}

// All workers busy: a request waits, and goes on when the worker frees.
func TestOverloadQueuesUntilCapacityFrees(t *testing.T) {
	tester := newTester(t)
	ow := newOverloadWorker(t, 1)
	tester.InitServer(overloadCaddyfile(ow.testWorker, "", ""), "caddyfile")
	admitted := metricValue(queueAdmittedTotal.WithLabelValues("m"))

	first := holdWorker(t, tester, ow)
	waiting := sendAsync(context.Background(), tester, "queued", "")
	waitDepth(t, 1)
	select {
	case r := <-waiting:
		t.Fatalf("a request went on while the only worker was busy: %+v", r)
	case <-time.After(200 * time.Millisecond):
	}
	close(ow.release)
	if r := <-first; r.status != http.StatusOK {
		t.Fatalf("held request: %+v", r)
	}
	if r := <-waiting; r.status != http.StatusOK {
		t.Fatalf("queued request: %+v", r)
	}
	waitDepth(t, 0)
	if got := metricValue(queueAdmittedTotal.WithLabelValues("m")) - admitted; got != 1 {
		t.Fatalf("admitted after wait: %v, want 1", got)
	}
}

// A full queue answers 429 with Retry-After at once, not after max_wait:
// max_wait is 30 s, and the client gives up after 5 s, so a 429 at all is
// one that did not wait.
func TestOverloadQueueFullSheds(t *testing.T) {
	tester := newTester(t)
	ow := newOverloadWorker(t, 1)
	tester.InitServer(overloadCaddyfile(ow.testWorker, "", "\t\toverload {\n\t\t\tqueue_size 1\n\t\t\tmax_wait 30s\n\t\t}\n"), "caddyfile")
	full := shedCount("queue_full")

	first := holdWorker(t, tester, ow)
	waiting := sendAsync(context.Background(), tester, "queued", "")
	waitDepth(t, 1)
	r := send(context.Background(), tester, "shed", "")
	if r.status != http.StatusTooManyRequests || r.retryAfter != "30" || !strings.Contains(r.body, "queue is full") {
		t.Fatalf("over the queue's bound: %+v", r)
	}
	if got := shedCount("queue_full") - full; got != 1 {
		t.Fatalf("queue_full sheds: %v", got)
	}
	close(ow.release)
	<-first
	if r := <-waiting; r.status != http.StatusOK {
		t.Fatalf("queued request: %+v", r)
	}
	for _, tag := range ow.sentTags() {
		if tag == "shed" {
			t.Fatal("the shed request reached the worker")
		}
	}
}

// A request that waits max_wait is answered 429.
func TestOverloadDeadlineSheds(t *testing.T) {
	tester := newTester(t)
	ow := newOverloadWorker(t, 1)
	tester.InitServer(overloadCaddyfile(ow.testWorker, "", "\t\toverload {\n\t\t\tmax_wait 300ms\n\t\t}\n"), "caddyfile")
	deadline := shedCount("deadline")

	first := holdWorker(t, tester, ow)
	r := send(context.Background(), tester, "late", "")
	if r.status != http.StatusTooManyRequests || r.retryAfter != "1" {
		t.Fatalf("past max_wait: %+v", r)
	}
	if r.took < 300*time.Millisecond {
		t.Fatalf("answered after %v, before max_wait", r.took)
	}
	if got := shedCount("deadline") - deadline; got != 1 {
		t.Fatalf("deadline sheds: %v", got)
	}
	waitDepth(t, 0)
	close(ow.release)
	<-first
}

// Waiting requests are admitted by class, highest first, FIFO within a
// class; an unknown class is the default one.
func TestOverloadPriorityOrder(t *testing.T) {
	tester := newTester(t)
	ow := newOverloadWorker(t, 1)
	tester.InitServer(overloadCaddyfile(ow.testWorker, "", ""), "caddyfile")

	first := holdWorker(t, tester, ow)
	sends := []struct{ tag, priority string }{
		{"low-1", "low"}, {"normal-1", ""}, {"low-2", "low"}, {"high-1", "high"},
		{"normal-2", "urgent!"}, {"high-2", "high"},
	}
	var results []<-chan overloadResult
	for i, s := range sends {
		results = append(results, sendAsync(context.Background(), tester, s.tag, s.priority))
		waitDepth(t, i+1) // queued in this order
	}
	close(ow.release)
	<-first
	for i, ch := range results {
		if r := <-ch; r.status != http.StatusOK {
			t.Fatalf("%s: %+v", sends[i].tag, r)
		}
	}
	got := strings.Join(ow.sentTags()[1:], " ")
	if want := "high-1 high-2 normal-1 normal-2 low-1 low-2"; got != want {
		t.Fatalf("admitted in the order %q, want %q", got, want)
	}
}

// A client that goes away leaves the queue, and the next waiter goes on.
func TestOverloadClientCancelLeavesQueue(t *testing.T) {
	tester := newTester(t)
	ow := newOverloadWorker(t, 1)
	tester.InitServer(overloadCaddyfile(ow.testWorker, "", ""), "caddyfile")
	canceled := shedCount("canceled")

	first := holdWorker(t, tester, ow)
	ctx, cancel := context.WithCancel(context.Background())
	gone := sendAsync(ctx, tester, "gone", "high")
	waitDepth(t, 1)
	stays := sendAsync(context.Background(), tester, "stays", "")
	waitDepth(t, 2)
	cancel()
	if r := <-gone; r.err == nil {
		t.Fatalf("the canceled request got an answer: %+v", r)
	}
	waitDepth(t, 1)
	// The queue's depth falls when the waiter leaves its line, and the
	// shed is counted just after, with no answer for the test to wait
	// on: so wait for the count.
	waitMetric(t, "canceled", func() float64 { return shedCount("canceled") - canceled }, 1)
	close(ow.release)
	<-first
	if r := <-stays; r.status != http.StatusOK {
		t.Fatalf("the remaining waiter: %+v", r)
	}
	if tags := strings.Join(ow.sentTags(), " "); tags != "hold stays" {
		t.Fatalf("the worker saw %q", tags)
	}
}

// A worker's 429, or 503 with Retry-After, marks it busy for a while, not
// failed: it is never taken out, requests wait for it, and go on when
// the mark runs out. A bare 503 still counts as a failure.
func TestOverloadWorkerOverloadedIsBusyNotFailed(t *testing.T) {
	tester := newTester(t)
	ow := newOverloadWorker(t, 1)
	tester.InitServer(overloadCaddyfile(ow.testWorker, "\t\tworker_down_after 100ms\n",
		"\t\toverload {\n\t\t\tworker_busy_for 400ms\n\t\t}\n"), "caddyfile")
	router := runningState().router
	// Its /health fails throughout: a worker taken out as failed would
	// stay out, not be probed back in.
	ow.status.Store(http.StatusServiceUnavailable)
	setAnswer := func(f func(http.ResponseWriter)) { ow.mu.Lock(); ow.answer = f; ow.mu.Unlock() }
	answer := func(code int, retryAfter string) func(http.ResponseWriter) {
		return func(rw http.ResponseWriter) {
			if retryAfter != "" {
				rw.Header().Set("Retry-After", retryAfter)
			}
			ow.answerError(rw, code)
		}
	}

	for _, c := range []struct {
		code       int
		retryAfter string
		busyFor    time.Duration
	}{{http.StatusTooManyRequests, "", 400 * time.Millisecond}, {http.StatusServiceUnavailable, "1", time.Second}} {
		setAnswer(answer(c.code, c.retryAfter))
		if r := send(context.Background(), tester, "", ""); r.status != c.code {
			t.Fatalf("the worker's %d reached the client as %+v", c.code, r)
		}
		if !router.Health().MarkedBusy(1) {
			t.Fatalf("a %d did not mark the worker busy", c.code)
		}
		setAnswer(nil)
		// Past worker_down_after: a failing worker would be down now.
		time.Sleep(300 * time.Millisecond)
		router.Sweep()
		if router.Health().WorkerDown(1) {
			t.Fatalf("a %d took the worker out as failed", c.code)
		}
		// The worker is busy until its mark runs out: the next request
		// waits for it, then goes on.
		r := send(context.Background(), tester, "after", "")
		if r.status != http.StatusOK {
			t.Fatalf("after the mark: %+v", r)
		}
		if r.took < c.busyFor-300*time.Millisecond-50*time.Millisecond {
			t.Fatalf("after a %d the next request went on after %v, before the mark ran out", c.code, r.took)
		}
	}

	// A bare 503 is a failure, as before.
	setAnswer(answer(http.StatusServiceUnavailable, ""))
	send(context.Background(), tester, "", "")
	if router.Health().MarkedBusy(1) {
		t.Fatal("a bare 503 marked the worker busy")
	}
	setAnswer(nil)
	time.Sleep(200 * time.Millisecond)
	router.Sweep()
	if !router.Health().WorkerDown(1) {
		t.Fatal("a bare 503 did not count as a failure")
	}
}
