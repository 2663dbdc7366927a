package selection

import (
	"math/rand/v2"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// BenchmarkSelectParallel measures the partition lock (issue 12, item 4):
// 1,024 callers select_and_reserve, then free, 99k-token prompts in one
// event-mode partition of 1,024 workers, against the same work done by one
// caller. Sub-benchmarks, in the order they run:
//
//   - serial: one caller, b.Loop. Its ns/op is the work of one call,
//     cpu-ns/op that in CPU time.
//   - locked: one caller, only what SelectAndReserve and Free do under
//     partition.mu (the snapshot; the re-check, response, bookLocked,
//     busy; load.free), on a prompt hashed and looked up once: how long
//     each call holds the lock, reported as held-ns/op, and the CPU time
//     of that as held-cpu-ns/op (ns/op adds the scoring, which runs
//     between the two critical sections).
//   - parallel: 1,024 goroutines (b.SetParallelism), b.RunParallel. Its
//     ns/op is wall time over calls (the inverse of throughput); x-serial
//     is that over serial's ns/op from the same run (1 = no gain from the
//     second core, 0.5 = perfect scaling); latency-ns is one call's wall
//     time with 1,024 in flight; lockwait-share is the fraction of the
//     callers' wall time spent blocked on any sync.Mutex/RWMutex or
//     runtime lock (runtime/metrics /sync/mutex/wait/total), and
//     lockwait-ns/op that time per call. Which lock it is: -mutexprofile.
//     cpu-ns/op is the process's CPU time per call, which other load on
//     the machine slows less than the wall time; rechosen-share the
//     fraction of calls whose pick went stale and was made again under
//     the lock.
//
// The index is an ApproxIndex handed over with WithIndexer, so the router
// runs in event mode (no booking is recorded in it) while lookups see a
// fixed, realistic content, as from an event index between events: 64
// workers hold a 16k-token system prompt, every worker an earlier
// conversation of its own, and each of 64 sessions the first 80k tokens of
// its 99k-token prompt on one worker (its previous turn). 256 requests are
// decoding on the system prompt's holders.
func BenchmarkSelectParallel(b *testing.B) {
	f := newParallelFixture(b)
	var serialNs float64
	b.Run("serial", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		c0 := threadCPU()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if err := f.selectAndFree(f.requests[i%len(f.requests)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
		serialNs = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		b.ReportMetric(float64((threadCPU()-c0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	})
	b.Run("locked", func(b *testing.B) {
		f.benchLocked(b)
	})
	b.Run("parallel", func(b *testing.B) {
		const callers = 1024
		b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		goroutines := int64(runtime.GOMAXPROCS(0) * ((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0)))
		b.ReportAllocs()
		var next atomic.Int64
		wait0, cpu0, rechosen0 := lockWait(), processCPU(), f.rechosen.Load()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			req := f.requests[int(next.Add(1))%len(f.requests)]
			for pb.Next() {
				if err := f.selectAndFree(req); err != nil {
					b.Error(err)
					return
				}
			}
		})
		elapsed := time.Since(start)
		wait, cpu := lockWait()-wait0, processCPU()-cpu0
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		b.ReportMetric(float64(wait.Nanoseconds())/float64(b.N), "lockwait-ns/op")
		b.ReportMetric(wait.Seconds()/(elapsed.Seconds()*float64(goroutines)), "lockwait-share")
		b.ReportMetric(float64(f.rechosen.Load()-rechosen0)/float64(b.N), "rechosen-share")
		b.ReportMetric(float64(elapsed.Nanoseconds())*float64(goroutines)/float64(b.N), "latency-ns")
		if serialNs > 0 {
			b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N)/serialNs, "x-serial")
		}
	})
}

// lockWait is the cumulative time goroutines have spent blocked on a
// sync.Mutex, sync.RWMutex or runtime-internal lock.
func lockWait() time.Duration {
	s := []metrics.Sample{{Name: "/sync/mutex/wait/total:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64 {
		return 0
	}
	return time.Duration(s[0].Value.Float64() * float64(time.Second))
}

// processCPU is the CPU time (user and system) the process has used: a
// call's cost on a machine whose other load slows its wall time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// threadCPU is the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID):
// with the goroutine locked to its thread, what a stretch of code cost in
// CPU, however much other load on the machine stretched its wall time.
func threadCPU() time.Duration {
	const clockThreadCPUTimeID = 3
	var ts syscall.Timespec
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}

type parallelFixture struct {
	r        *Router
	requests []*SelectRequest
	// rechosen counts the selections whose pick from the snapshot went
	// stale and was made again under the lock.
	rechosen atomic.Int64
}

func (f *parallelFixture) selectAndFree(req *SelectRequest) error {
	// Each call gets its own selection id: the request is shared by the
	// goroutines of a session and must not be written.
	r := *req
	res, err := f.r.SelectAndReserve(&r)
	if err != nil {
		return err
	}
	if res.Overlap.LongestMatched < 16_000 {
		return errorf(KindInternal, "system prompt not matched: %+v", res.Overlap)
	}
	return f.r.Free(res.SelectionID)
}

// benchLocked repeats what one select_and_reserve and its free do while
// holding partition.mu (book.go's selectRequest, reserve.go's release),
// on a prompt hashed and looked up once.
func (f *parallelFixture) benchLocked(b *testing.B) {
	e := f.r.sel
	req := f.requests[0]
	q, err := e.setupRequest(&req.Partition, nil, &req.Prompt, "")
	if err != nil {
		b.Fatal(err)
	}
	defer putWork(q.w)
	p, w := q.p, q.w
	track := e.cfg.get().TrackActiveBlocks
	// The booking's copy of the hashes is made before the lock is taken;
	// each booking is freed before the next, so one copy serves them all.
	hashes := slices.Clone(w.tracking)
	c := choice{placement: &req.Placement, book: true}
	var held, heldCPU time.Duration
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	for b.Loop() {
		t0, c0 := time.Now(), threadCPU()
		p.mu.Lock()
		p.snapshot(w, c.usesTaints())
		p.mu.Unlock()
		held, heldCPU = held+time.Since(t0), heldCPU+threadCPU()-c0
		// The scoring, outside the lock: in ns/op, not in held-ns/op.
		sel, err := e.choose(p, w, &q.s, q.np, c)
		if err != nil {
			b.Fatal(err)
		}
		t0, c0 = time.Now(), threadCPU()
		p.mu.Lock()
		if !e.stillChoosable(p, &sel, c, &q.s, w) {
			p.mu.Unlock()
			b.Fatal("a serial pick went stale")
		}
		sel.potDec = sel.rs.decodeBlocks() + sel.newBlks
		resp := response(p, &sel, "id") // Lean, as the kv_router handler asks: no fillDP
		bk, err := e.book.bookLocked(p, sel.rs, "id", "", "", hashes, nil, q.np.isl, sel.prefill, q.s.trackPrefill, nil)
		if err != nil {
			p.mu.Unlock()
			b.Fatal(err)
		}
		e.busy(&sel, resp, false)
		p.mu.Unlock()
		p.mu.Lock()
		p.load.free(bk, track)
		p.mu.Unlock()
		held, heldCPU = held+time.Since(t0), heldCPU+threadCPU()-c0
	}
	b.ReportMetric(float64(held.Nanoseconds())/float64(b.N), "held-ns/op")
	b.ReportMetric(float64(heldCPU.Nanoseconds())/float64(b.N), "held-cpu-ns/op")
}

func newParallelFixture(b *testing.B) *parallelFixture {
	const workers, sessions = 1024, 64
	cfg := DefaultConfig()
	cfg.UseKVEvents = true
	idx := NewApproxIndex(24 * time.Hour)
	f := &parallelFixture{}
	r, err := NewRouter(cfg, WithIndexer(idx), WithSelectTiming(func(t SelectTiming) {
		if t.Rechosen {
			f.rechosen.Add(1)
		}
	}))
	if err != nil {
		b.Fatal(err)
	}
	f.r = r
	b.Cleanup(r.Close)
	for id := uint64(1); id <= workers; id++ {
		ep := "10.0.0.1:" + strconv.Itoa(int(8000+id))
		kv := map[string]string{"0": "tcp://10.0.0.1:" + strconv.Itoa(int(20000+id))}
		if _, err := r.Catalog().UpsertWorker(&WorkerRequest{WorkerID: ptr(id), Endpoint: &ep, BlockSize: ptr(uint32(16)), KVEventsEndpoints: kv}); err != nil {
			b.Fatal(err)
		}
	}
	key := (&Partition{}).Key()
	rng := rand.New(rand.NewPCG(1, 1))
	random := func(t []uint32, n int) []uint32 {
		for range n {
			t = append(t, uint32(rng.IntN(150000)))
		}
		return t
	}
	system := random(nil, 16_000)
	hashes := func(t []uint32) []uint64 { return AppendBlockHashes(nil, t, 16, HashOptions{}) }
	// 64 workers (every 16th) served the system prompt; every worker holds
	// an earlier conversation of its own.
	for i := range workers {
		rank := Rank{WorkerID: uint64(i + 1)}
		own := random(nil, 4_000+16*i)
		if i%16 == 0 {
			idx.RecordBooking(key, rank, hashes(append(append([]uint32(nil), system...), own...)))
		} else {
			idx.RecordBooking(key, rank, hashes(own))
		}
	}
	// Each session's previous turn (its first 80k tokens) is on one worker.
	for s := range sessions {
		t := random(append([]uint32(nil), system...), 99_000-16_000)
		idx.RecordBooking(key, Rank{WorkerID: uint64(s*16 + 5)}, hashes(t[:80_000]))
		f.requests = append(f.requests, &SelectRequest{Prompt: Prompt{TokenIDs: t}, Lean: true})
	}
	// Live load: 256 requests decoding on the system prompt.
	for i := range 256 {
		res, err := r.SelectAndReserve(&SelectRequest{Prompt: Prompt{TokenIDs: random(append([]uint32(nil), system...), 64*i)}})
		if err != nil {
			b.Fatal(err)
		}
		_ = r.PrefillComplete(res.SelectionID)
	}
	return f
}
