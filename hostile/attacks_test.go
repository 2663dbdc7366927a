package hostile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/indexer"
)

// The attacks of issue 10. Each returns the answer it observed, reduced to
// the words of its expected answer when the gateway behaved (so that the
// table compares like with like), and a detail with the figures behind it.

// run is what an attack works with: its subtest, the gateway, and state
// that attacks on the same gateway hand on to each other.
type run struct {
	t       *testing.T
	g       *gateway
	sh      *shared
	before  usage // the gateway's RSS and fds as the attack began
	aborted string
}

// shared is carried from the index flood to the attacks that follow it on
// the same gateway (/dump, deleting the flooding worker).
type shared struct {
	floodBase    int64 // RSS before the flood
	floodWorkers []uint64
	bystander    uint64 // the worker whose blocks the flood must leave alone
}

type result struct{ answer, detail string }

// fatalf ends an attack whose set-up failed: the table shows why, and the
// subtest fails, rather than the attack reporting a misleading answer.
func (r *run) fatalf(format string, args ...any) {
	r.t.Helper()
	r.aborted = fmt.Sprintf(format, args...)
	r.t.Fatal(r.aborted)
}

// worker starts a worker and registers it; subscribed waits until the
// gateway listens to its KV events (needed before publishing any).
func (r *run) worker(id uint64, mode workerMode, subscribed bool) *worker {
	r.t.Helper()
	w := startWorker(r.t, id, mode)
	if err := r.g.register(w.record()); err != nil {
		r.fatalf("%v", err)
	}
	if subscribed {
		if err := w.pub.waitSubscribed(10 * time.Second); err != nil {
			r.fatalf("%v", err)
		}
	}
	return w
}

func (r *run) stats() map[string]float64 {
	r.t.Helper()
	s, err := r.g.stats()
	if err != nil {
		r.fatalf("reading /kv_router/stats: %v", err)
	}
	return s
}

// waitIndexed waits until worker id has at least n blocks indexed.
func (r *run) waitIndexed(id uint64, n int) {
	r.t.Helper()
	got := 0
	if !waitFor(10*time.Second, func() bool {
		got, _ = r.g.indexedBlocks(id)
		return got >= n
	}) {
		r.fatalf("worker %d's events never reached the index (%d of %d blocks)", id, got, n)
	}
}

// benign are the KV-event counters of ordinary traffic, and of sequence
// accounting (a listener that missed messages counts a gap and what it
// lost, whatever the reason); any other that rises is the gateway counting
// something it refused or dropped.
var benign = map[string]bool{"messages": true, "batches": true, "replays": true, "replayed": true,
	"listeners": true, "stale": true, "applied": true, "gaps": true, "lost": true}

// gauge reports whether a stats field is a size or a setting rather than
// a count of events (entries, bytes, budgets), which any batch moves.
func gauge(name string) bool {
	for _, w := range []string{"entries", "bytes", "memory", "max"} {
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}

// refusals lists the counters of the kv_events and index sections, other
// than benign ones and gauges, that rose between two stats reads.
func refusals(before, after map[string]float64) string {
	d := statsDelta(before, after, func(k string) bool {
		sec, name, ok := strings.Cut(k, ".")
		return ok && (sec == "kv_events" || sec == "index") && !benign[name] && !gauge(name)
	})
	return deltaString(d)
}

func deltaString(d map[string]float64) string {
	var parts []string
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range d {
			if !yield(k) {
				return
			}
		}
	}) {
		parts = append(parts, fmt.Sprintf("%s %+.4g", k, d[k]))
	}
	return strings.Join(parts, ", ")
}

// answerNote is a status with the reason of a refusal ("accepted" for a
// success, whose body is only the record echoed).
func answerNote(a answer) string {
	if a.status/100 == 2 {
		return a.code() + " accepted"
	}
	return fmt.Sprintf("%s %q", a.code(), a.reason())
}

func mb(b int64) string { return fmt.Sprintf("%.0f MB", float64(b)/(1<<20)) }

// --- 1. Ranks: one registration, and the total ---

// registerDPSize registers one worker with data_parallel_size n (issue 10:
// 4294967295 ended the process; 1000000 cost 340 MB and a 52 MB answer).
func registerDPSize(n uint32, sayAlive bool) func(*run) result {
	return func(r *run) result {
		rec := workerRecord(1, deadEndpoint, "tcp://"+deadEndpoint)
		rec["data_parallel_size"] = n
		a := r.g.write(http.MethodPost, "/workers", rec, r.g.token)
		// A fatal error takes a moment to end the process.
		time.Sleep(300 * time.Millisecond)
		ans := a.code()
		if sayAlive {
			if r.g.Alive() {
				ans += ", alive"
			} else {
				ans += ", exited"
			}
		}
		return result{ans, fmt.Sprintf("%s, %d-byte answer", answerNote(a), a.size)}
	}
}

// rankEndpoints gives ranks [0, n) each a KV-event endpoint: with them a
// worker is complete, and each rank would get a listener (a socket, fds).
func rankEndpoints(n int) map[string]string {
	eps := make(map[string]string, n)
	for i := range n {
		eps[strconv.Itoa(i)] = "tcp://" + deadEndpoint
	}
	return eps
}

// tenThousandRanks: one registration of 10,000 ranks with per-rank
// endpoints opened 18,848 fds in issue 10.
func tenThousandRanks(r *run) result {
	rec := workerRecord(1, deadEndpoint, "")
	delete(rec, "kv_events_endpoint")
	rec["data_parallel_size"] = 10000
	rec["kv_events_endpoints"] = rankEndpoints(10000)
	a := r.g.write(http.MethodPost, "/workers", rec, r.g.token)
	time.Sleep(time.Second) // listeners start after the answer: let the sampler see them
	return result{a.code(), fmt.Sprintf("%s; %d fds after", answerNote(a), usageOf(r.g.pid).fds)}
}

// rankTotal registers workers of max_ranks_per_worker ranks each until the
// gateway refuses one: every rank is a listener, so the total must be
// bounded too, not only each worker.
func rankTotal(r *run) result {
	total := 0
	for i := range 8 {
		rec := workerRecord(uint64(100+i), deadEndpoint, "")
		delete(rec, "kv_events_endpoint")
		rec["data_parallel_size"] = maxRanksPerWorker
		rec["kv_events_endpoints"] = rankEndpoints(maxRanksPerWorker)
		a := r.g.write(http.MethodPost, "/workers", rec, r.g.token)
		if a.status/100 == 2 {
			total += maxRanksPerWorker
			continue
		}
		time.Sleep(time.Second) // let the accepted workers' listeners open
		fds := usageOf(r.g.pid).fds
		detail := fmt.Sprintf("%d ranks accepted, then %s; %d fds", total, answerNote(a), fds)
		if total > 0 {
			detail += fmt.Sprintf(" (%.1f per rank)", float64(fds-r.before.fds)/float64(total))
		}
		if a.status == http.StatusConflict && total <= maxRanks {
			return result{fmt.Sprintf("409 past %d ranks", maxRanks), detail}
		}
		return result{fmt.Sprintf("%s after %d ranks", a.code(), total), detail}
	}
	time.Sleep(time.Second)
	return result{fmt.Sprintf("all %d ranks accepted", total), fmt.Sprintf("%d fds", usageOf(r.g.pid).fds)}
}

// --- 2. Catalog writes: who may, and how much ---

// catalogWrites tries every catalog write on an existing worker with
// token (empty: none) and checks each is refused with want and that the
// catalog did not change. PUT is not a route of the API (405 whatever
// the token) and passes with 405.
func catalogWrites(token string, want int) func(*run) result {
	return func(r *run) result {
		rec := workerRecord(1, deadEndpoint, "tcp://"+deadEndpoint)
		if err := r.g.register(rec); err != nil {
			r.fatalf("%v", err)
		}
		if token == "wrong" {
			token = r.g.token + "x"
		}
		hijack := workerRecord(1, "127.0.0.1:9", "tcp://127.0.0.1:9")
		tries := []struct {
			method, path string
			body         any
		}{
			{http.MethodPost, "/workers", workerRecord(2, "127.0.0.1:9", "tcp://127.0.0.1:9")},
			{http.MethodPost, "/workers", hijack},
			{http.MethodPut, "/workers/1", hijack},
			{http.MethodPatch, "/workers/1", map[string]any{"endpoint": "127.0.0.1:9"}},
			{http.MethodDelete, "/workers/1", nil},
		}
		var got []string
		ok := true
		for _, tr := range tries {
			a := r.g.write(tr.method, tr.path, tr.body, token)
			got = append(got, tr.method+" "+a.code())
			ok = ok && (a.status == want || (tr.method == http.MethodPut && a.status == http.StatusMethodNotAllowed))
		}
		// The catalog must be as the operator left it.
		a := call(quick, http.MethodGet, r.g.api+"/workers", nil, nil)
		var ws []struct {
			WorkerID uint64 `json:"worker_id"`
			Endpoint string `json:"endpoint"`
		}
		_ = json.Unmarshal(a.body, &ws)
		intact := len(ws) == 1 && ws[0].WorkerID == 1 && ws[0].Endpoint == deadEndpoint
		detail := strings.Join(got, ", ")
		if !intact {
			detail += fmt.Sprintf("; catalog changed: %s", clip(string(a.body), 120))
		}
		if ok && intact {
			return result{strconv.Itoa(want), detail}
		}
		if !intact {
			return result{"catalog changed", detail}
		}
		return result{"not refused", detail}
	}
}

// oversizedField registers a worker with one field made huge: each field
// is stored in the catalog and listed by every GET /workers.
func oversizedField(field string, value any) func(*run) result {
	return func(r *run) result {
		rec := workerRecord(1, deadEndpoint, "tcp://"+deadEndpoint)
		rec[field] = value
		a := r.g.write(http.MethodPost, "/workers", rec, r.g.token)
		ans := a.code()
		if a.status == http.StatusRequestEntityTooLarge || a.status == http.StatusUnprocessableEntity {
			ans = "422 or 413"
		}
		return result{ans, answerNote(a)}
	}
}

// --- 3. Endpoints that are the gateway itself ---

// selfEndpoint registers a worker whose endpoint is one of the gateway's
// own listeners: with the admin listener, a request through the proxy
// could load a new config (issue 10).
func selfEndpoint(addr func(g *gateway) string) func(*run) result {
	return func(r *run) result {
		rec := workerRecord(1, addr(r.g), "tcp://"+deadEndpoint)
		a := r.g.write(http.MethodPost, "/workers", rec, r.g.token)
		if a.status/100 == 2 {
			// Take it out again, so the next endpoint is tried on its own.
			r.g.write(http.MethodDelete, "/workers/1", nil, r.g.token)
			return result{a.code() + ", accepted", addr(r.g)}
		}
		if a.status == http.StatusUnprocessableEntity && a.reason() != "" {
			return result{"422 with a reason", a.reason()}
		}
		return result{a.code(), a.reason()}
	}
}

// --- 4. An upsert that moves a worker ---

// endpointSwap gives a worker that holds a session's prefix a new endpoint
// (another server): the new server holds nothing, so the session's next
// turn must not be told it is cached there, nor be sent there for it.
func endpointSwap(r *run) result {
	a := r.worker(1, vllm, true)
	c := r.worker(2, vllm, true)
	b := startWorker(r.t, 3, vllm) // the new server, not registered as itself
	prompt := tokens(1000, 96)
	if err := a.pub.send(batch(-1, stored(1<<32, prompt))); err != nil {
		r.fatalf("publishing: %v", err)
	}
	r.waitIndexed(1, 6)
	session := map[string]string{"X-Session-ID": "hostile-session"}
	body := func(p []uint32) []byte {
		j, _ := json.Marshal(map[string]any{"model": model, "prompt": p, "max_tokens": 4})
		return j
	}
	turn1 := call(slow, http.MethodPost, r.g.proxy+"/v1/completions", body(append(prompt, tokens(5000, 16)...)), session)
	if turn1.status != http.StatusOK || turn1.header.Get("X-KVRouter-Worker") != "1" {
		r.fatalf("turn 1 did not go to the worker holding its prefix: %s, worker %q, cached %q",
			turn1.code(), turn1.header.Get("X-KVRouter-Worker"), turn1.header.Get("X-KVRouter-Cached-Tokens"))
	}
	moved := a.record()
	moved["endpoint"] = b.addr
	if err := r.g.register(moved); err != nil {
		r.fatalf("%v", err)
	}
	time.Sleep(200 * time.Millisecond)
	hits := func() [3]int64 { return [3]int64{a.completions.Load(), b.completions.Load(), c.completions.Load()} }
	h0 := hits()
	turn2 := call(slow, http.MethodPost, r.g.proxy+"/v1/completions",
		body(append(append(prompt, tokens(5000, 16)...), tokens(6000, 16)...)), session)
	h1 := hits()
	where := "nowhere"
	for i, name := range []string{"the old server", "the new server", "the other worker"} {
		if h1[i] > h0[i] {
			where = name
		}
	}
	stale, _ := r.g.indexedBlocks(1)
	cached := turn2.header.Get("X-KVRouter-Cached-Tokens")
	detail := fmt.Sprintf("turn 1: worker 1 with %s cached; turn 2: %s to %s (worker %q) with %q cached; %d blocks indexed under worker 1",
		turn1.header.Get("X-KVRouter-Cached-Tokens"), turn2.code(), where, turn2.header.Get("X-KVRouter-Worker"), cached, stale)
	if cached == "0" && stale == 0 && turn2.status == http.StatusOK {
		return result{"cached 0, no stale index", detail}
	}
	return result{fmt.Sprintf("%s, cached %q, %d stale blocks", turn2.code(), cached, stale), detail}
}

// --- 5. Dead and failing workers ---

// killFleet kills every worker, as kill -9 would, while a client keeps
// sending: the 502s of an unreachable fleet must stop once the workers are
// taken out (worker_down_after plus a sweep) and the gateway must then say
// 503 itself, in OpenAI's error shape.
func killFleet(r *run) result {
	ws := []*worker{r.worker(1, vllm, true), r.worker(2, vllm, true)}
	short := &http.Client{Timeout: 5 * time.Second}
	for i := range 4 {
		if a := r.g.completion(short, model, tokens(uint32(100*i), 32)); a.status != http.StatusOK {
			r.fatalf("the fleet does not serve before the kill: %s %s", a.code(), a.reason())
		}
	}
	for _, w := range ws {
		w.kill()
	}
	t0 := time.Now()
	deadline := t0.Add(workerDownAfter + 8*time.Second)
	var last502, first503 time.Duration = -1, -1
	var streak time.Time
	counts := map[string]int{}
	shapeOK := true
	lastCode := ""
	for time.Now().Before(deadline) {
		a := r.g.completion(short, model, tokens(7, 32))
		at := time.Since(t0)
		lastCode = a.code()
		counts[lastCode]++
		switch {
		case a.status == http.StatusBadGateway:
			last502, streak = at, time.Time{}
		case a.status == http.StatusServiceUnavailable:
			if first503 < 0 {
				first503 = at
			}
			shapeOK = shapeOK && openAIShape(a.body)
			if streak.IsZero() {
				streak = time.Now()
			}
		default:
			streak = time.Time{}
		}
		if !streak.IsZero() && time.Since(streak) >= 1500*time.Millisecond {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	detail := fmt.Sprintf("answers after the kill: %v; last 502 at %s, first 503 at %s", counts, secs(last502), secs(first503))
	grace := workerDownAfter + 3*time.Second
	switch {
	case streak.IsZero():
		return result{"no steady answer; last " + lastCode, detail}
	case last502 > grace:
		return result{fmt.Sprintf("502s for %s", secs(last502)), detail}
	case !shapeOK:
		return result{"503 not in OpenAI shape", detail}
	}
	return result{"502s stop, then 503 in OpenAI shape", detail}
}

func secs(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}

// only503 puts a worker that answers 503 to everything next to a healthy
// one, and makes it the best candidate (it holds the prompt's prefix):
// after worker_down_after it must receive nothing.
func only503Worker(r *run) result {
	bad := r.worker(1, only503, true)
	r.worker(2, vllm, true)
	prompt := tokens(2000, 64)
	if err := bad.pub.send(batch(-1, stored(1<<32, prompt))); err != nil {
		r.fatalf("publishing: %v", err)
	}
	r.waitIndexed(1, 4)
	send := func(d time.Duration) map[string]int {
		counts := map[string]int{}
		for end := time.Now().Add(d); time.Now().Before(end); {
			a := r.g.completion(slow, model, append(slices.Clone(prompt), tokens(9000, 16)...))
			counts[a.code()]++
			time.Sleep(50 * time.Millisecond)
		}
		return counts
	}
	c1 := send(workerDownAfter + 3*time.Second)
	during := bad.completions.Load()
	c2 := send(2 * time.Second)
	after := bad.completions.Load() - during
	detail := fmt.Sprintf("first %s: %v, %d reached the 503 worker; next 2s: %v, %d reached it",
		workerDownAfter+3*time.Second, c1, during, c2, after)
	switch {
	case during == 0:
		return result{"inconclusive: it never got a request", detail}
	case after > 0:
		return result{fmt.Sprintf("not taken out (%d requests after %s)", after, workerDownAfter+3*time.Second), detail}
	}
	return result{"taken out", detail}
}

// --- 6. Memory: frames, the index, /dump ---

// bigFrames sends three 400 MB frames to a listener: a bounded subscriber
// drops each at its header; an unbounded one buffers it whole (1.3 GB
// RSS in issue 10) before finding it malformed.
func bigFrames(r *run) result {
	zp := newZMTPPublisher(r.t)
	if err := r.g.register(workerRecord(1, deadEndpoint, zp.ep)); err != nil {
		r.fatalf("%v", err)
	}
	s0 := r.stats()
	var zc *zmtpConn
	defer func() {
		if zc != nil {
			zc.close()
		}
	}()
	var notes []string
	dropped := 0
	for i := range 3 {
		if zc == nil {
			var err error
			if zc, err = zp.accept(10 * time.Second); err != nil {
				notes = append(notes, fmt.Sprintf("frame %d: the listener did not (re)connect: %v", i+1, err))
				break
			}
		}
		sent, err := zc.sendBig(uint64(i), 400<<20)
		if err != nil || zc.hungUp(500*time.Millisecond) {
			dropped++
			notes = append(notes, fmt.Sprintf("frame %d cut after %s", i+1, mb(sent)))
			zc.close()
			zc = nil
			continue
		}
		notes = append(notes, fmt.Sprintf("frame %d read whole", i+1))
	}
	// The listener must still work: one ordinary store afterwards.
	recovered := "the listener did not come back"
	if zc == nil {
		zc, _ = zp.accept(10 * time.Second)
	}
	if zc != nil {
		if zc.sendSmall(3, batch(-1, stored(1<<32, tokens(500, 32)))) == nil &&
			waitFor(5*time.Second, func() bool { n, _ := r.g.indexedBlocks(1); return n >= 2 }) {
			recovered = "the listener works afterwards"
		}
	}
	counted := refusals(s0, r.stats())
	detail := fmt.Sprintf("%s; counted: %s; %s", strings.Join(notes, ", "), orNone(counted), recovered)
	switch {
	case dropped < 3:
		return result{fmt.Sprintf("%d of 3 read whole", 3-dropped), detail}
	case counted == "":
		return result{"dropped, not counted", detail}
	}
	return result{"dropped and counted", detail}
}

func orNone(s string) string {
	if s == "" {
		return "nothing"
	}
	return s
}

// Flood size: several times the entries index_max_memory admits
// (indexer.EntriesForMemory: 64 MiB is about 230k entries).
const (
	floodBlocks   = 2_000_000
	floodChain    = 1000 // blocks per BlockStored, chained as an engine stores a long prompt
	floodPerBatch = 8    // BlockStored events per message
)

// Another worker's cache, stored before the flood: ten prompts of 32
// blocks, as the probe of session 15 had them.
const (
	bystanderPrompts = 10
	bystanderBlocks  = 32
)

// flood has one publisher store floodBlocks distinct blocks, far past the
// index's memory budget: the index must evict (and count it) and the
// process stay within its budget plus 100 MB. Another worker's blocks,
// stored before the flood and well within its share of the budget, must
// all stay indexed, and that worker's next store onto one of its prompts
// must be taken (its parent still known): eviction takes from the ranks
// over their share, the flooder's.
func flood(r *run) result {
	by := r.worker(11, vllm, true)
	byHash := func(p, b int) uint64 { return uint64(p+1)<<32 | uint64(b+1) }
	for p := range bystanderPrompts {
		ev := stored(0, tokens(uint32(900_000_000+p*10_000), bystanderBlocks*blockSize))
		for b := range ev.BlockHashes {
			ev.BlockHashes[b] = byHash(p, b)
		}
		if err := by.pub.send(batch(-1, ev)); err != nil {
			r.fatalf("publishing: %v", err)
		}
	}
	r.waitIndexed(11, bystanderPrompts*bystanderBlocks)
	w := r.worker(10, vllm, true)
	r.sh.floodBase, r.sh.floodWorkers, r.sh.bystander = r.before.rss, []uint64{10}, 11
	s0 := r.stats()
	start := time.Now()
	sent := 0
	chainToks := make([][]uint32, floodPerBatch)
	for i := range chainToks {
		chainToks[i] = make([]uint32, floodChain*blockSize) // zeros after the first token
	}
	for chain := 0; chain < floodBlocks/floodChain; chain += floodPerBatch {
		evs := make([]any, 0, floodPerBatch)
		for j := range floodPerBatch {
			// The first token makes each chain's root, and so every block
			// under it, distinct.
			chainToks[j][0] = uint32(chain + j + 1)
			evs = append(evs, stored(uint64(chain+j+1)<<20, chainToks[j]))
		}
		if err := w.pub.send(batch(-1, evs...)); err != nil {
			r.fatalf("publishing: %v", err)
		}
		sent++
	}
	// Wait for the gateway to go through the backlog: counters still for 1.5 s.
	var s1 map[string]float64
	still := time.Now()
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline) && r.g.Alive(); {
		time.Sleep(250 * time.Millisecond)
		s, err := r.g.stats()
		if err != nil {
			continue
		}
		if s1 == nil || s["kv_events.messages"] != s1["kv_events.messages"] || s["kv_events.batches"] != s1["kv_events.batches"] ||
			s["index.entries"] != s1["index.entries"] {
			s1, still = s, time.Now()
		} else if time.Since(still) >= 1500*time.Millisecond {
			break
		}
	}
	if s1 == nil {
		r.fatalf("no stats after the flood (the gateway %s)", map[bool]string{true: "is alive", false: "exited"}[r.g.Alive()])
	}
	evicted := 0.0
	for k, v := range statsDelta(s0, s1, nil) {
		if strings.Contains(k, "evict") {
			evicted += v
		}
	}
	kept, err := r.g.indexedBlocks(11)
	if err != nil {
		r.fatalf("reading the workers: %v", err)
	}
	// The bystander's next block, onto the last of its first prompt.
	parent := byHash(0, bystanderBlocks-1)
	next := stored(0, tokens(950_000_000, blockSize))
	next.BlockHashes[0], next.Parent = byHash(0, bystanderBlocks), &parent
	if err := by.pub.send(batch(-1, next)); err != nil {
		r.fatalf("publishing: %v", err)
	}
	extended := waitFor(5*time.Second, func() bool {
		n, _ := r.g.indexedBlocks(11)
		return n > kept
	})
	detail := fmt.Sprintf("%d blocks in %d messages, taken in %.1fs; index entries %.0f; counters: %s; then RSS %s, %s; "+
		"the other worker kept %d of its %d blocks, its next store taken: %v",
		floodBlocks, sent, time.Since(start).Seconds(), s1["index.entries"], orNone(refusals(s0, s1)),
		mb(usageOf(r.g.pid).rss), r.g.goMemory(), kept, bystanderPrompts*bystanderBlocks, extended)
	switch {
	case evicted == 0:
		return result{"no evictions counted", detail}
	case kept < bystanderPrompts*bystanderBlocks || !extended:
		return result{"evicted and counted, the other worker's blocks lost", detail}
	}
	return result{"evicted and counted, the other worker's blocks kept", detail}
}

// dump reads GET /dump of the flooded index as a client would, streaming:
// it must be capped at max_dump_events and not built whole in memory
// (issue 10: 655 MB in 11.7 s, RSS 2.7 → 5.1 GB).
func dump(r *run) result {
	s := r.stats()
	if s["index.entries"] <= maxDumpEvents {
		r.fatalf("the index holds %.0f entries: nothing to cap (did the flood run on this gateway?)", s["index.entries"])
	}
	req, _ := http.NewRequest(http.MethodGet, r.g.api+"/dump", nil)
	start := time.Now()
	resp, err := (&http.Client{Timeout: 120 * time.Second}).Do(req)
	if err != nil {
		return result{"no answer (" + shortErr(err) + ")", ""}
	}
	defer resp.Body.Close()
	firstByte := time.Duration(0)
	// Count the events as they stream in; a key cut by a read boundary is
	// found in the window that keeps the previous read's tail.
	key := []byte(`"event_id"`)
	buf := make([]byte, 256<<10)
	window := make([]byte, 0, len(buf)+len(key))
	var size int64
	events := 0
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 && firstByte == 0 {
			firstByte = time.Since(start)
		}
		size += int64(n)
		window = append(window, buf[:n]...)
		events += bytes.Count(window, key)
		// The tail is shorter than the key, so nothing is counted twice.
		tail := window[len(window)-min(len(window), len(key)-1):]
		window = append(window[:0], tail...)
		if err != nil {
			if err != io.EOF {
				return result{"cut: " + shortErr(err), fmt.Sprintf("%d events, %s read", events, mb(size))}
			}
			break
		}
	}
	detail := fmt.Sprintf("%d %s; %d events, %s, first byte after %.2fs, all in %.2fs (index: %.0f entries)",
		resp.StatusCode, resp.Header.Get("Content-Type"), events, mb(size), firstByte.Seconds(), time.Since(start).Seconds(), s["index.entries"])
	if resp.StatusCode == http.StatusOK && events <= maxDumpEvents {
		return result{fmt.Sprintf("capped at %d events", maxDumpEvents), detail}
	}
	return result{fmt.Sprintf("%d %d events", resp.StatusCode, events), detail}
}

// deleteFlooders deletes the workers that flooded the index: what they
// took must go back (issue 10: 2.55 GB stayed after the delete).
func deleteFlooders(r *run) result {
	if len(r.sh.floodWorkers) == 0 {
		r.fatalf("no flood ran on this gateway")
	}
	top := usageOf(r.g.pid).rss
	for _, id := range r.sh.floodWorkers {
		if a := r.g.write(http.MethodDelete, fmt.Sprintf("/workers/%d", id), nil, r.g.token); a.status/100 != 2 {
			r.fatalf("deleting worker %d: %s %s", id, a.code(), a.reason())
		}
	}
	// Fallen: back at least halfway from the flood's top to where the
	// gateway stood before it.
	target := r.sh.floodBase + (top-r.sh.floodBase)/2
	start := time.Now()
	rss := top
	fell := waitFor(20*time.Second, func() bool { rss = usageOf(r.g.pid).rss; return rss <= target })
	// What is left must be the bystander's blocks alone.
	kept, err := r.g.indexedBlocks(r.sh.bystander)
	if err != nil {
		r.fatalf("reading the workers: %v", err)
	}
	entries := r.stats()["index.entries"] - float64(kept)
	detail := fmt.Sprintf("RSS %s before the flood, %s after it, %s %.1fs after the delete (%s); index entries %.0f besides the other worker's %d",
		mb(r.sh.floodBase), mb(top), mb(rss), time.Since(start).Seconds(), r.g.goMemory(), entries, kept)
	if top-r.sh.floodBase < 32<<20 {
		return result{"inconclusive: the flood took little memory", detail}
	}
	if fell && entries == 0 {
		return result{"RSS falls", detail}
	}
	return result{fmt.Sprintf("RSS stays at %s", mb(rss)), detail}
}

// --- 7. Reservations nobody frees ---

// reservations books 3,000 prompts of 2,000 tokens and frees none (issue
// 10: 6.1M prefill tokens booked for the 1 h reservation_ttl).
func reservations(r *run) result {
	r.worker(1, vllm, false)
	body, _ := json.Marshal(map[string]any{"model_name": model, "token_ids": tokens(40000, 2000)})
	counts := map[string]int{}
	firstRefusal, firstCode := 0, ""
	for i := range 3000 {
		a := call(slow, http.MethodPost, r.g.api+"/select_and_reserve", body, nil)
		counts[a.code()]++
		if a.status/100 != 2 && firstRefusal == 0 {
			firstRefusal, firstCode = i+1, a.code()+" "+a.reason()
		}
	}
	held := r.stats()["active_reservations"]
	detail := fmt.Sprintf("answers %v; first refusal at call %d (%s); %.0f reservations held", counts, firstRefusal, firstCode, held)
	if counts["429"] == 3000-maxReservationsPerClient && firstRefusal == maxReservationsPerClient+1 {
		return result{fmt.Sprintf("429 past %d", maxReservationsPerClient), detail}
	}
	if firstRefusal == 0 {
		return result{"all 3000 reserved", detail}
	}
	return result{fmt.Sprintf("%s from call %d", strings.Fields(firstCode)[0], firstRefusal), detail}
}

// --- 8. Events that lie ---

// seqJump publishes five ordinary batches, then jumps the sequence to 2^63
// (issue 10: +9.2e18 on kvrouter_kv_events_lost_total).
func seqJump(r *run) result {
	w := r.worker(1, vllm, true)
	s0 := r.stats()
	for s := range uint64(5) {
		if err := w.pub.sendSeq(s, batch(-1, stored(s<<16, tokens(uint32(3000+100*s), 32)))); err != nil {
			r.fatalf("publishing: %v", err)
		}
	}
	if !waitFor(5*time.Second, func() bool { s, _ := r.g.stats(); return s["kv_events.batches"] >= s0["kv_events.batches"]+5 }) {
		r.fatalf("the five ordinary batches were not applied")
	}
	lost0, err := r.g.metric("kvrouter_kv_events_lost_total")
	if err != nil {
		r.fatalf("%v", err)
	}
	s1 := r.stats()
	for i := range uint64(2) {
		_ = w.pub.sendSeq(1<<63+i, batch(-1, stored(1<<40+i<<16, tokens(uint32(8000+100*i), 32))))
	}
	waitFor(5*time.Second, func() bool { s, _ := r.g.stats(); return s["kv_events.messages"] >= s1["kv_events.messages"]+2 })
	time.Sleep(300 * time.Millisecond)
	lost1, _ := r.g.metric("kvrouter_kv_events_lost_total")
	s2 := r.stats()
	d := statsDelta(s1, s2, func(k string) bool { return strings.HasPrefix(k, "kv_events.") })
	jump := 0.0
	for k, v := range d {
		if strings.Contains(k, "restart") || strings.Contains(k, "jump") {
			jump += v
		}
	}
	detail := fmt.Sprintf("kvrouter_kv_events_lost_total %.4g → %.4g; kv_events: %s", lost0, lost1, orNone(deltaString(d)))
	var bad []string
	if lost1-lost0 > maxGap || lost1 < lost0 {
		bad = append(bad, fmt.Sprintf("lost_total %+.3g", lost1-lost0))
	}
	if jump == 0 {
		bad = append(bad, "not counted as jump/restart")
	}
	if bad == nil {
		return result{"lost_total bounded, counted as jump/restart", detail}
	}
	return result{strings.Join(bad, ", "), detail}
}

// unknownRank publishes 5,000 blocks under dp_rank 7 for a one-rank worker
// (issue 10: 80,000 entries stored under ranks that do not exist), then
// two blocks under its own rank to know the first batch was handled.
func unknownRank(r *run) result {
	w := r.worker(1, vllm, true)
	s0 := r.stats()
	if err := w.pub.send(batch(7, stored(1<<40, tokens(9000, 5000*blockSize)))); err != nil {
		r.fatalf("publishing: %v", err)
	}
	if err := w.pub.send(batch(-1, stored(1<<41, tokens(200000, 2*blockSize)))); err != nil {
		r.fatalf("publishing: %v", err)
	}
	r.waitIndexed(1, 2)
	s1 := r.stats()
	foreign := s1["index.entries"] - s0["index.entries"] - 2
	counted := refusals(s0, s1)
	detail := fmt.Sprintf("%.0f entries stored for dp_rank 7; counted: %s", foreign, orNone(counted))
	switch {
	case foreign != 0:
		return result{fmt.Sprintf("%.0f entries under dp_rank 7", foreign), detail}
	case counted == "":
		return result{"dropped, not counted", detail}
	}
	return result{"dropped and counted, no entries", detail}
}

// foreignTopic plays a publisher that dials the gateway's bound endpoint
// from 127.0.0.1 and sends under the topic of worker 1, registered on
// 127.0.0.2 (another loopback address: another host, to the gateway),
// while worker 1's own publisher dials from 127.0.0.2: the forger removes
// worker 1's blocks and stores 1,000 of its own. Then worker 1's publisher
// stores four more blocks, which must still land.
func foreignTopic(r *run) result {
	const honestBlocks, forgedBlocks, moreBlocks = 32, 1000, 4
	rec := map[string]any{"worker_id": 1, "model_name": model, "endpoint": "127.0.0.2:9", "block_size": blockSize}
	if err := r.g.register(rec); err != nil {
		r.fatalf("%v", err)
	}
	topic := "kv@1@" + model
	honest := newDialer(r.t, "127.0.0.2", r.g.ports.events, topic)
	ev := stored(1<<40, tokens(1000, honestBlocks*blockSize))
	// A PUB drops what it sends until it is connected and subscribed:
	// send until it lands (the same blocks again count once).
	if !waitFor(10*time.Second, func() bool {
		_ = honest.send(batch(-1, ev))
		n, _ := r.g.indexedBlocks(1)
		return n == honestBlocks
	}) {
		r.fatalf("worker 1's own publisher never reached the index")
	}
	s0 := r.stats()
	forger := newDialer(r.t, "127.0.0.1", r.g.ports.events, topic)
	forged := batch(-1, indexer.Removal{BlockHashes: ev.BlockHashes}, stored(1<<41, tokens(500000, forgedBlocks*blockSize)))
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err := forger.send(forged); err != nil {
			r.fatalf("publishing: %v", err)
		}
	}
	time.Sleep(300 * time.Millisecond) // what reached the gateway is applied by now
	after, _ := r.g.indexedBlocks(1)
	s1 := r.stats()
	more := stored(1<<42, tokens(900000, moreBlocks*blockSize))
	heard := waitFor(5*time.Second, func() bool {
		_ = honest.send(batch(-1, more))
		n, _ := r.g.indexedBlocks(1)
		return n == after+moreBlocks
	})
	counted := refusals(s0, s1)
	detail := fmt.Sprintf("worker 1's blocks %d → %d; its own publisher heard after: %v; counted: %s", honestBlocks, after, heard, orNone(counted))
	switch {
	case after != honestBlocks:
		return result{fmt.Sprintf("the forged events applied (%d blocks)", after), detail}
	case !heard:
		return result{"the worker's own publisher no longer heard", detail}
	case counted == "":
		return result{"refused, not counted", detail}
	}
	return result{"cut and counted, the worker's blocks unchanged", detail}
}

// --- 9. Requests that go nowhere ---

// unservedModel asks for a model no worker serves: the fallback policy
// used to send it to a worker of another model.
func unservedModel(r *run) result {
	ws := []*worker{r.worker(1, vllm, false), r.worker(2, vllm, false)}
	a := r.g.completion(slow, "no-such-model", tokens(100, 32))
	hits := ws[0].completions.Load() + ws[1].completions.Load()
	ans := a.code()
	if openAIShape(a.body) {
		ans += " OpenAI shape"
	} else {
		ans += " not OpenAI shape"
	}
	if hits == 0 {
		ans += ", no worker hit"
	} else {
		ans += fmt.Sprintf(", %d reached workers", hits)
	}
	return result{ans, clip(string(a.body), 120)}
}

// hangingWorker is a worker that takes a completion and never answers:
// the client must get a 504 after response_header_timeout, not wait
// forever.
func hangingWorker(r *run) result {
	r.worker(1, hangHeaders, false)
	c := &http.Client{Timeout: 15 * time.Second}
	a := r.g.completion(c, model, tokens(100, 32))
	detail := fmt.Sprintf("%s after %.1fs, OpenAI shape %v", a.code(), a.elapsed.Seconds(), openAIShape(a.body))
	switch {
	case a.status == 0:
		return result{fmt.Sprintf("client held %.0fs, no answer", a.elapsed.Seconds()), detail}
	case a.status == http.StatusGatewayTimeout && a.elapsed < 3*responseHeaderTimeout+time.Second:
		return result{fmt.Sprintf("504 after %s", responseHeaderTimeout), detail}
	}
	return result{fmt.Sprintf("%s after %.1fs", a.code(), a.elapsed.Seconds()), detail}
}
