package indexer

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// BenchmarkIngestFleetProcess is BenchmarkIngestFleetZMQ with the
// publishers where a fleet has them: in another process. In
// BenchmarkIngestFleetZMQ the 1,024 engines' encoding and sending, and
// their side of libzmq, run in the benchmark's own process, so its
// blocks/s is the two cores' rate for both ends together. Here this
// test binary starts itself again as the fleet (fleetChildEnv), and the
// parent, which holds only the listeners and the index as a gateway
// does, measures its own CPU (getrusage RUSAGE_SELF: every thread,
// libzmq's I/O threads included) per block applied. That figure is what
// the "≥ 5M blocks/s on two cores" is about: the gateway's two
// cores, with the engines elsewhere. Both processes still share this
// machine's two cores, so the blocks/s measured here is lower than what
// the gateway's CPU per block gives; the benchmark reports both.
//
//	INGEST_PUBLISHERS=1024 go test -run '^$' -bench IngestFleetProcess -benchtime 200x ./indexer/
//
// Metrics, of the steady state (the second of three laps): blocks/s
// (wall, both processes on the machine's cores), gateway-cpu-ns/block
// and fleet-cpu-ns/block (each process's CPU per block stored), and
// gateway-2core-blocks/s (2 s of CPU a second over
// gateway-cpu-ns/block); the same with "-first" for the first lap, whose
// memory is new, and with "-lookups" for the third, while the benchmark's
// goroutine looks the 100k-token prompt up in a loop (back to back, or
// one every LOOKUP_EVERY), whose p50 and p99 it reports as
// BenchmarkIngestFleetZMQ does. With LOOKUP_OVER=http the lookups are
// requests from a third process instead (ingest_lookup_child_test.go),
// reported as idle-http-p50-µs and so on, and the server's handler time
// alone as idle-http-handler-p50-µs and so on. FLEET_NICE runs the fleet
// niced (startFleetChild); FLEET_BLOCKS sets the blocks a payload stores
// and removes (fleetBlocksFromEnv); FLEET_RATE paces the fleet to that
// many blocks a second in all (fleetRateFromEnv), so that the lookups'
// latency can be read at an ingest rate a fleet sends rather than at the
// most the gateway takes. FLEET_RECEIVER=libzmq receives through libzmq
// SUBs, the baseline of the native receiver (nativelistener.go).
// FLEET_MODE=bind has the publishers dial one endpoint the gateway binds
// (bindpeer.go), each under its worker's topic; with FLEET_RECEIVER=libzmq
// through the frame gate's relay to a libzmq SUB, as bind mode was before.
func BenchmarkIngestFleetProcess(b *testing.B) {
	publishers := fleetPublishersFromEnv(b)
	blocks, err := fleetBlocksFromEnv() // the fleet process reads it too
	if err != nil {
		b.Fatal(err)
	}
	if _, err := fleetRateFromEnv(); err != nil {
		b.Fatal(err) // read by the fleet process; refused here first
	}
	viaLibzmq, err := fleetReceiverFromEnv()
	if err != nil {
		b.Fatal(err)
	}
	bindMode, err := fleetModeFromEnv()
	if err != nil {
		b.Fatal(err)
	}
	x, prompt := findMatchesFleet(b)
	var fleet *fleetChild
	stats := make([]*Stats, publishers)
	if bindMode {
		bl := startFleetBindListener(b, x, publishers, viaLibzmq)
		defer bl.Stop()
		for i := range stats {
			stats[i] = bl.statsOf(fleetWorkerID(i))
		}
		b.Setenv(fleetBindEnv, bl.Endpoint()) // the fleet process dials it
		fleet = startFleetChild(b, publishers, blocks)
		defer fleet.stop()
	} else {
		fleet = startFleetChild(b, publishers, blocks)
		defer fleet.stop()
		// A listener takes three sockets: its SUB and its monitor's pair.
		zctx := fleetContext(b, 3*publishers)
		for i, ep := range fleet.endpoints {
			stats[i] = new(Stats)
			rank := selection.Rank{WorkerID: fleetWorkerID(i)}
			l, err := StartListener(zctx, x, stats[i], nil, ListenerConfig{Endpoint: ep, Partition: part, Rank: rank, viaLibzmq: viaLibzmq})
			if err != nil {
				b.Fatalf("listener %d: %v", i, err)
			}
			defer l.Stop()
		}
	}
	fleet.waitReady(b)
	every := lookupEvery(b)
	var lookups *httpLookups
	if lookupOverHTTP(b) {
		lookups = startHTTPLookups(b, x, prompt, every)
		defer lookups.stop()
	}
	var idle, busy []time.Duration
	var idleHTTP, busyHTTP, idleHandler, busyHandler [2]time.Duration
	if lookups != nil {
		idleHTTP[0], idleHTTP[1] = lookups.idle(b, time.Second)
		idleHandler[0], idleHandler[1] = lookups.handlerPercentiles()
	} else {
		idle = lookupLatencies(x, prompt, 200, 0, nil)
	}

	// Three laps of b.N payloads per publisher. The first stores each
	// rank's opening window (blocks with nothing to remove yet), and
	// libzmq's queues and the index grow to what this fleet keeps: their
	// memory is touched for the first time (the gateway's RSS grew by
	// about 300 MB in a 1,024-publisher run). A gateway that has run a
	// while is past that, so the first lap is reported apart ("-first")
	// and the steady state is the second, alone, and the third, with the
	// lookups running.
	first := fleet.lap(b, stats, 0, b.N, nil)
	alone := fleet.lap(b, stats, b.N, b.N, nil)
	withLookups := fleet.lap(b, stats, 2*b.N, b.N, func(applied func() bool) {
		if lookups == nil {
			busy = lookupLatencies(x, prompt, 0, every, applied)
			return
		}
		lookups.start(b)
		for !applied() {
			time.Sleep(100 * time.Microsecond)
		}
		busyHTTP[0], busyHTTP[1] = lookups.finish(b)
		busyHandler[0], busyHandler[1] = lookups.handlerPercentiles()
	})
	b.StopTimer()
	for i := range stats {
		if stats[i].Gaps.Load() != 0 || stats[i].Malformed.Load() != 0 {
			b.Fatalf("publisher %d: gaps %d malformed %d", i, stats[i].Gaps.Load(), stats[i].Malformed.Load())
		}
	}
	first.report(b, "-first")
	alone.report(b, "")
	withLookups.report(b, "-lookups")
	if lookups != nil {
		reportPercentiles(b, "idle-http", idleHTTP[0], idleHTTP[1])
		reportPercentiles(b, "ingest-http", busyHTTP[0], busyHTTP[1])
		reportPercentiles(b, "idle-http-handler", idleHandler[0], idleHandler[1])
		reportPercentiles(b, "ingest-http-handler", busyHandler[0], busyHandler[1])
		return
	}
	reportLatency(b, "idle", idle)
	reportLatency(b, "ingest", busy)
}

// lapFigures is one lap's rate and each side's CPU per block.
type lapFigures struct {
	blocksPerSecond   float64
	gatewayNsPerBlock float64
	fleetNsPerBlock   float64
}

func (f lapFigures) report(b *testing.B, suffix string) {
	b.ReportMetric(f.blocksPerSecond, "blocks/s"+suffix)
	b.ReportMetric(f.gatewayNsPerBlock, "gateway-cpu-ns/block"+suffix)
	b.ReportMetric(f.fleetNsPerBlock, "fleet-cpu-ns/block"+suffix)
	b.ReportMetric(2e9/f.gatewayNsPerBlock, "gateway-2core-blocks/s"+suffix)
}

// fleetChild is the publishing process, driven by lines on its stdin.
type fleetChild struct {
	blocks    int // stored (and removed) by each payload
	cmd       *exec.Cmd
	in        io.WriteCloser
	out       *bufio.Scanner
	endpoints []string
}

// startFleetChild starts the fleet and reads its endpoints. FLEET_NICE,
// when set, is the fleet's nice value (0-19, through nice(1)): a fleet's
// engines run on machines of their own, and here they share the
// gateway's two cores; niced, they get what the gateway leaves, so the
// gateway's own latencies show with less of the sharing in them.
func startFleetChild(b *testing.B, publishers, blocks int) *fleetChild {
	var niceness []string
	if v := os.Getenv("FLEET_NICE"); v != "" {
		if n, err := strconv.Atoi(v); err != nil || n < 0 || n > 19 {
			b.Fatalf("FLEET_NICE=%q: want 0-19", v)
		}
		niceness = []string{"nice", "-n", v}
	}
	cmd, in, out, err := startSelf(fleetChildEnv+"="+strconv.Itoa(publishers), niceness...)
	if err != nil {
		b.Fatal(err)
	}
	c := &fleetChild{blocks: blocks, cmd: cmd, in: in, out: out}
	for c.out.Scan() {
		line := c.out.Text()
		if line == "bound" {
			return c
		}
		c.endpoints = append(c.endpoints, line)
	}
	c.stop()
	b.Fatalf("fleet process ended before binding: %v", c.out.Err())
	return nil
}

// waitReady waits until every publisher has seen its listener subscribe.
func (c *fleetChild) waitReady(b *testing.B) {
	if line := c.reply(b); line != "ready" {
		b.Fatalf("fleet process: %q, want ready", line)
	}
}

func (c *fleetChild) reply(b *testing.B) string {
	if !c.out.Scan() {
		b.Fatalf("fleet process ended: %v", c.out.Err())
	}
	return c.out.Text()
}

// lap has every publisher send payloads [from, from+n), runs during (if
// any) until all are applied, and returns the lap's figures.
func (c *fleetChild) lap(b *testing.B, stats []*Stats, from, n int, during func(applied func() bool)) lapFigures {
	start, cpu0 := time.Now(), selfCPU()
	if _, err := fmt.Fprintf(c.in, "lap %d %d\n", from, n); err != nil {
		b.Fatal(err)
	}
	applied := func() bool {
		for i := range stats {
			if stats[i].Batches.Load() < uint64(from+n) {
				return false
			}
		}
		return true
	}
	if during != nil {
		during(applied)
	}
	for !applied() {
		time.Sleep(100 * time.Microsecond)
	}
	wall, gatewayCPU := time.Since(start), selfCPU()-cpu0
	// Everything sent has arrived, so the fleet's CPU for the lap is done.
	if _, err := fmt.Fprintln(c.in, "cpu"); err != nil {
		b.Fatal(err)
	}
	line := c.reply(b)
	fleetCPU, err := strconv.ParseInt(strings.TrimPrefix(line, "sent "), 10, 64)
	if err != nil {
		b.Fatalf("fleet process: %q", line)
	}
	blocks := float64(len(stats) * n * c.blocks)
	return lapFigures{
		blocksPerSecond:   blocks / wall.Seconds(),
		gatewayNsPerBlock: float64(gatewayCPU.Nanoseconds()) / blocks,
		fleetNsPerBlock:   float64(fleetCPU) / blocks,
	}
}

// startSelf starts this test binary again with env set (a child role:
// fleetChildEnv, lookupChildEnv), under the wrapper command when one is
// given, its stdin and stdout piped to the caller and its stderr to ours.
func startSelf(env string, wrapper ...string) (*exec.Cmd, io.WriteCloser, *bufio.Scanner, error) {
	args := append(wrapper, os.Args[0], "-test.run", "^$", "-test.bench", "^$")
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), env)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, err
	}
	return cmd, in, bufio.NewScanner(out), nil
}

func (c *fleetChild) stop() {
	_ = c.in.Close() // the fleet stops at the end of its input
	_ = c.cmd.Wait()
}

// fleetModeFromEnv reads FLEET_MODE: "connect" (or unset), the gateway
// dialing each publisher, or "bind", the publishers dialing one bound
// endpoint (startFleetBindListener).
func fleetModeFromEnv() (bind bool, err error) { return envChoice("FLEET_MODE", "connect", "bind") }

// fleetBindEnv carries the bound endpoint to the fleet process in bind
// mode (runFleetChild).
const fleetBindEnv = "INDEXER_FLEET_BIND"

// fleetWorkerID is publisher i's worker id.
func fleetWorkerID(i int) uint64 { return uint64(100_000 + i) }

// startFleetBindListener binds the gateway's endpoint for a fleet of
// publishers, each under its worker's topic, read by the gateway itself
// (bindpeer.go) or, with viaLibzmq, through the gate's relay to a libzmq
// SUB, the baseline.
func startFleetBindListener(b *testing.B, x *Index, publishers int, viaLibzmq bool) *BindListener {
	resolve := func(id uint64, model string) (ListenerConfig, bool) {
		if id < fleetWorkerID(0) || id >= fleetWorkerID(publishers) || model != "m" {
			return ListenerConfig{}, false
		}
		return ListenerConfig{Partition: part, Rank: selection.Rank{WorkerID: id}, WorkerEndpoint: "127.0.0.1:8000"}, true
	}
	opts := []ManagerOption{WithMaxPeers(2 * publishers)}
	if viaLibzmq {
		opts = append(opts, func(l *limits) { l.relayed = true })
	}
	bl, err := StartBindListener(fleetContext(b, 16), x, new(Stats), nil, "tcp://127.0.0.1:*", resolve, opts...)
	if err != nil {
		b.Fatal(err)
	}
	return bl
}

// statsOf is worker id's counts in a bind listener, made now if need be.
func (b *BindListener) statsOf(id uint64) *Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.workerStats(id)
}

// fleetReceiverFromEnv reads FLEET_RECEIVER: "native" (or unset), or
// "libzmq" for the baseline.
func fleetReceiverFromEnv() (viaLibzmq bool, err error) {
	return envChoice("FLEET_RECEIVER", "native", "libzmq")
}

// envChoice reads the environment variable name, one of two values:
// false for usual (or unset), true for other.
func envChoice(name, usual, other string) (bool, error) {
	switch v := os.Getenv(name); v {
	case "", usual:
		return false, nil
	case other:
		return true, nil
	default:
		return false, fmt.Errorf("%s=%q: %s or %s", name, v, usual, other)
	}
}
