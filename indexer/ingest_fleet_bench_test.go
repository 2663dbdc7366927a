package indexer

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// BenchmarkIngestFleetZMQ measures ingest the way a fleet produces it:
// INGEST_PUBLISHERS engines (default 64; issue 15 asks for 1,024), each a
// real tcp XPUB with its own Listener and rank, each publishing b.N
// steady-state payloads (16 blocks stored, 16 older ones removed) as fast
// as libzmq takes them, into the partition BenchmarkFindMatches100k
// builds (1,024 workers, ~1M entries). Meanwhile the benchmark's goroutine
// looks the 100k-token prompt up in a loop (back to back, or one every
// LOOKUP_EVERY); the same lookups run first
// with no ingest, so one run reports both sides of the target:
// blocks applied per second through the whole path (receive, decode,
// hash, apply) and the lookup's p50 and p99 idle and during ingest.
//
//	INGEST_PUBLISHERS=1024 go test -run '^$' -bench IngestFleetZMQ -benchtime 200x ./indexer/
//
// -benchtime Nx sets the payloads per publisher.
func BenchmarkIngestFleetZMQ(b *testing.B) {
	publishers := fleetPublishersFromEnv(b)
	x, prompt := findMatchesFleet(b)
	// A publisher takes a socket and a listener three (its SUB and its
	// monitor's pair).
	zctx := fleetContext(b, 4*publishers)
	fleet := make([]*fleetPublisher, publishers)
	for i := range fleet {
		p, err := startFleetPublisher(zctx, x, selection.Rank{WorkerID: fleetWorkerID(i)}, uint64(i))
		if err != nil {
			b.Fatalf("publisher %d: %v", i, err)
		}
		defer p.stop()
		fleet[i] = p
	}
	idle := lookupLatencies(x, prompt, 200, 0, nil)
	every := lookupEvery(b)

	// Three laps of b.N payloads per publisher: the first grows the
	// index and libzmq's queues into new memory (BenchmarkIngestFleetProcess
	// says more), the second is the steady state alone, the third runs
	// with the lookups.
	first := ingestLap(b, fleet, 0, b.N, nil)
	alone := ingestLap(b, fleet, b.N, b.N, nil)
	var busy []time.Duration
	withLookups := ingestLap(b, fleet, 2*b.N, b.N, func(applied func() bool) {
		busy = lookupLatencies(x, prompt, 0, every, applied)
	})
	b.StopTimer()
	for _, p := range fleet {
		if p.stats.Gaps.Load() != 0 || p.stats.Malformed.Load() != 0 {
			b.Fatalf("publisher %d: gaps %d malformed %d", p.rank.WorkerID, p.stats.Gaps.Load(), p.stats.Malformed.Load())
		}
	}
	b.ReportMetric(first, "blocks/s-first")
	b.ReportMetric(alone, "blocks/s")
	b.ReportMetric(withLookups, "blocks/s-during-lookups")
	reportLatency(b, "idle", idle)
	reportLatency(b, "ingest", busy)
}

// ingestLap has every publisher send payloads [from, from+n), runs during
// (if any) until they are all applied, and returns the blocks applied per
// second.
func ingestLap(b *testing.B, fleet []*fleetPublisher, from, n int, during func(applied func() bool)) float64 {
	start := time.Now()
	var senders sync.WaitGroup
	for _, p := range fleet {
		senders.Go(func() { p.publish(b, from, n) })
	}
	applied := func() bool {
		for _, p := range fleet {
			if p.stats.Batches.Load() < uint64(from+n) {
				return false
			}
		}
		return true
	}
	if during != nil {
		during(applied)
	}
	senders.Wait()
	for !applied() {
		time.Sleep(100 * time.Microsecond)
	}
	return float64(len(fleet)*n*blocksPer) / time.Since(start).Seconds()
}

// fleetPayloads is how many distinct payloads a fleet publisher cycles
// through, and fleetWindow how many payloads later it removes a
// payload's blocks: a rank holds at most fleetPayloads-fleetWindow
// payloads' blocks, so 1,024 publishers stay within the machine.
const fleetPayloads, fleetWindow = 96, 32

// fleetPublisher is one engine of BenchmarkIngestFleetZMQ.
type fleetPublisher struct {
	sock     *zmq.Socket
	listener *Listener
	stats    Stats
	rank     selection.Rank
	payloads steady[[]byte]
}

func startFleetPublisher(zctx *zmq.Context, x *Index, rank selection.Rank, seed uint64) (*fleetPublisher, error) {
	sock, err := zctx.NewSocket(zmq.XPUB)
	if err != nil {
		return nil, err
	}
	p := &fleetPublisher{sock: sock, rank: rank}
	p.payloads = fleetSteadyPayloads(seed, blocksPer)
	_ = sock.SetLinger(0)
	_ = sock.SetSndhwm(0) // never drop: this measures throughput, not loss
	if err := sock.Bind("tcp://127.0.0.1:*"); err != nil {
		sock.Close()
		return nil, err
	}
	ep, _ := sock.GetLastEndpoint()
	p.listener, err = StartListener(zctx, x, &p.stats, nil, ListenerConfig{Endpoint: ep, Partition: part, Rank: rank})
	if err != nil {
		sock.Close()
		return nil, err
	}
	_ = sock.SetRcvtimeo(10 * time.Second)
	if _, err := sock.RecvBytes(0); err != nil { // the listener's subscription
		p.stop()
		return nil, err
	}
	return p, nil
}

// publish sends the payloads with sequence numbers [from, from+n); the
// socket is used by this goroutine only while it runs.
func (p *fleetPublisher) publish(b *testing.B, from, n int) {
	if err := sendSteady(p.sock, nil, p.payloads, from, n); err != nil {
		b.Error(err)
	}
}

// sendPaced sends payloads [from, from+n) as sendSteady does, one every
// interval (none when 0), the first after phase: a fleet's engines each
// publish at their own pace, not all at once.
func sendPaced(sock *zmq.Socket, topic []byte, payloads steady[[]byte], from, n int, interval, phase time.Duration) error {
	if interval <= 0 {
		return sendSteady(sock, topic, payloads, from, n)
	}
	next := time.Now().Add(phase)
	for seq := from; seq < from+n; seq++ {
		time.Sleep(time.Until(next))
		if err := sendSteady(sock, topic, payloads, seq, 1); err != nil {
			return err
		}
		next = next.Add(interval)
	}
	return nil
}

// fleetRateFromEnv reads FLEET_RATE, the blocks a second the whole fleet
// stores (and as many it removes); 0, unset, is as fast as the gateway
// takes them.
func fleetRateFromEnv() (float64, error) {
	s := os.Getenv("FLEET_RATE")
	if s == "" {
		return 0, nil
	}
	r, err := strconv.ParseFloat(s, 64)
	if err != nil || r < 1e3 || r > 1e8 {
		return 0, fmt.Errorf("FLEET_RATE=%q: want 1000-1e8 blocks a second", s)
	}
	return r, nil
}

// sendSteady sends a fleet publisher's payloads with sequence numbers
// [from, from+n), under topic (empty in connect mode).
func sendSteady(sock *zmq.Socket, topic []byte, payloads steady[[]byte], from, n int) error {
	var s [8]byte
	for seq := from; seq < from+n; seq++ {
		binary.BigEndian.PutUint64(s[:], uint64(seq))
		if _, err := sock.SendMessage(topic, s[:], payloads.at(seq)); err != nil {
			return err
		}
	}
	return nil
}

func (p *fleetPublisher) stop() {
	if p.listener != nil {
		p.listener.Stop()
	}
	p.sock.Close()
}

// fleetSteadyPayloads is steadyPayloads at fleet size, of blocks blocks
// each. A rank holds fleetWindow×blocksPer = 512 blocks whatever the
// payloads' size (rounded down to whole payloads): bigger payloads remove
// theirs fewer payloads later, so the index stays the same size and only
// the messages change.
func fleetSteadyPayloads(seed uint64, blocks int) steady[[]byte] {
	win := max(1, fleetWindow*blocksPer/blocks)
	return steadyCycle(EncodingArray, rand.New(rand.NewPCG(seed, 0xf1ee7)), fleetPayloads, win, blocks)
}

// fleetBlocksFromEnv is FLEET_BLOCKS, the blocks each payload of
// BenchmarkIngestFleetProcess's fleet stores (and removes): blocksPer
// unless set. An engine publishes one payload per scheduler step, so a
// step that prefills 1,024 tokens stores 64 blocks of 16 in one message;
// the gateway's cost per message is spread over that many. At most 256
// (the fleet process then holds about 2 GB of payloads).
func fleetBlocksFromEnv() (int, error) {
	s := os.Getenv("FLEET_BLOCKS")
	if s == "" {
		return blocksPer, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 256 {
		return 0, fmt.Errorf("FLEET_BLOCKS=%q: want 1-256", s)
	}
	return n, nil
}

// lookupLatencies looks prompt up n times, or until done reports true
// when n is 0, and returns the latencies sorted. With every > 0 a lookup
// starts every that often (a gateway's requests arrive spread out),
// otherwise back to back.
func lookupLatencies(x *Index, prompt []uint32, n int, every time.Duration, done func() bool) []time.Duration {
	var m selection.Matches
	var hashes []uint64
	var lat []time.Duration
	next := time.Now()
	for i := 0; n == 0 || i < n; i++ {
		if n == 0 && done() {
			break
		}
		if every > 0 {
			next = next.Add(every)
			time.Sleep(time.Until(next))
		}
		t0 := time.Now()
		hashes = lookUp(x, prompt, hashes, &m)
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	return lat
}

// lookUp is one lookup of the fleet benchmarks: prompt hashed in blocks
// of 16 into hashes (returned for reuse) and looked up into m.
func lookUp(x *Index, prompt []uint32, hashes []uint64, m *selection.Matches) []uint64 {
	m.Reset()
	hashes = selection.AppendBlockHashes(hashes[:0], prompt, 16, selection.HashOptions{})
	x.FindMatches(part, hashes, m)
	return hashes
}

// fleetPublishersFromEnv is INGEST_PUBLISHERS, the fleet benchmarks'
// engine count: 64 unless set (issue 15 asks for 1,024).
func fleetPublishersFromEnv(b *testing.B) int {
	s := os.Getenv("INGEST_PUBLISHERS")
	if s == "" {
		return 64
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		b.Fatalf("INGEST_PUBLISHERS=%q", s)
	}
	return n
}

// fleetContext is a ZMQ context for a fleet benchmark's sockets, ended
// when the benchmark is: libzmq's default bound of 1,023 sockets a
// context would refuse the 256th engine.
func fleetContext(b *testing.B, sockets int) *zmq.Context {
	zctx, err := zmq.NewContext()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = zctx.Term() })
	if err := zctx.SetMaxSockets(sockets + 16); err != nil {
		b.Fatal(err)
	}
	return zctx
}

// lookupEvery is LOOKUP_EVERY (a duration, e.g. 1ms): how often the
// ingest benchmarks start a lookup while ingest runs, 0 (the default)
// for back to back. Back to back is the most a lookup stream can contend
// for the lock; a gateway's lookups come one per request.
func lookupEvery(b *testing.B) time.Duration {
	s := os.Getenv("LOOKUP_EVERY")
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		b.Fatalf("LOOKUP_EVERY=%q", s)
	}
	return d
}

// reportLatency reports the p50 and p99 of sorted latencies as name-p50-µs
// and name-p99-µs.
func reportLatency(b *testing.B, name string, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	p50, p99 := percentiles(lat)
	reportPercentiles(b, name, p50, p99)
}

func reportPercentiles(b *testing.B, name string, p50, p99 time.Duration) {
	b.ReportMetric(float64(p50.Microseconds()), name+"-p50-µs")
	b.ReportMetric(float64(p99.Microseconds()), name+"-p99-µs")
}

// percentiles returns the p50 and p99 of sorted, non-empty latencies.
func percentiles(lat []time.Duration) (p50, p99 time.Duration) {
	return lat[len(lat)/2], lat[len(lat)*99/100]
}
