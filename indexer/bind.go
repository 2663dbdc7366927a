package indexer

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/zap"
)

// Bind mode: one SUB bound on an endpoint that workers' publishers connect
// to (vLLM connects its PUB when its endpoint names a remote host). Each
// publisher must use its own topic, kv@<worker_id>@<model>; the worker id
// finds the catalog record that says the partition, the rank and the
// replay endpoint. Each catalog worker has its own sequence
// (docs/kv-events.md §1).

// Resolver returns where a bind-mode publisher's events go, from the worker
// id of its topic; ok is false for a worker the catalog does not know.
type Resolver func(workerID uint64, model string) (cfg ListenerConfig, ok bool)

// BindListener receives the events of every publisher that connects to it.
type BindListener struct {
	zctx     *zmq.Context
	index    *Index
	stats    *Stats
	log      *zap.Logger
	resolve  Resolver
	endpoint string
	limits   limits

	stop chan struct{}
	gate *frameGate // nil for an inproc:// endpoint
	done chan struct{}
	once sync.Once

	// A listener on a libzmq SUB (an inproc:// endpoint, or a benchmark's
	// baseline): its wait (nil: receives block with a timeout instead),
	// its monitor (nil when it could not start) and its goroutine's turn
	// to ingest, shared by the streams it reads.
	wait *readWait
	mon  *monitor
	turn *ingestTurn

	mu sync.Mutex
	// streams are kept per worker id, whichever connections carry them
	// (bindStream); guarded by mu.
	streams map[uint64]*bindStream
	// counts are each worker's streams' counts, kept across a stream's
	// replacement (its worker's record changed) and dropped when a message
	// finds the worker gone from the catalog (one of a few hundred bytes
	// per worker the catalog ever held meanwhile); read by the admin route
	// through Manager.WorkerCounts. Guarded by mu.
	counts map[uint64]*Stats
}

// bindStream is one worker's stream in bind mode. Its deliveries may come
// from more than one connection (a publisher that dialed again before its
// old connection was seen to close; under kv_events_bind_peers any, a
// connection that carries several workers' topics), each read on a
// goroutine of its own, so mu makes them take turns.
type bindStream struct {
	mu sync.Mutex
	stream
}

// StartBindListener binds endpoint and starts receiving. Its options set
// the message size bound and the largest sequence gap (WithMaxMessageBytes,
// WithMaxGap), for every publisher whose resolved ListenerConfig leaves
// them 0, the bound of publishers connected at once (WithMaxPeers) and who
// may publish under a worker's topic (WithBindPeers). A tcp:// or ipc://
// endpoint is served by a frame gate (framegate.go), which accepts the
// publishers and reads each one's connection itself (bindpeer.go); an
// inproc:// endpoint, which only this process can reach, by a libzmq SUB.
func StartBindListener(zctx *zmq.Context, index *Index, stats *Stats, log *zap.Logger, endpoint string, resolve Resolver, opts ...ManagerOption) (*BindListener, error) {
	if log == nil {
		log = zap.NewNop()
	}
	lim := defaultLimits()
	lim.apply(opts)
	b := &BindListener{zctx: zctx, index: index, stats: stats, log: log, resolve: resolve, endpoint: endpoint, limits: lim,
		stop: make(chan struct{}), done: make(chan struct{}), streams: map[uint64]*bindStream{}, counts: map[uint64]*Stats{}}
	network, addr, gated, err := gateNetwork(endpoint)
	if err != nil {
		return nil, err
	}
	if !gated || lim.ungated {
		return b.started(b.startSub(endpoint, nil))
	}
	var hosts *workerHosts
	if lim.bindPeers == PeersWorkerHost {
		hosts = newWorkerHosts(resolve, lim.workerHosts)
	}
	gate, err := openGate(network, addr, lim.maxMessageBytes, lim.maxPeers, hosts, stats, log)
	if err != nil {
		return nil, fmt.Errorf("kv events bind %s: %w", endpoint, err)
	}
	b.gate, b.endpoint = gate, gate.endpoint()
	if lim.relayed {
		return b.started(b.startSub(endpoint, gate))
	}
	gate.read = b.read
	gate.serve()
	go func() {
		defer close(b.done)
		<-b.stop
		gate.stop() // closes every connection and waits for its reader
	}()
	return b, nil
}

// started returns b, or nil and err when it could not start.
func (b *BindListener) started(err error) (*BindListener, error) {
	if err != nil {
		return nil, err
	}
	return b, nil
}

// startSub binds a libzmq SUB, on endpoint or behind gate (which passes
// each publisher's connection on to it), and starts its goroutine.
func (b *BindListener) startSub(endpoint string, gate *frameGate) error {
	sub, err := b.zctx.NewSocket(zmq.SUB)
	if err == nil {
		if err = setupSub(sub, b.limits.maxMessageBytes, endpoint); err == nil {
			inner := endpoint
			if gate != nil {
				inner, err = gate.behindSub()
			}
			if err == nil {
				err = sub.Bind(inner)
			}
		}
	}
	// One err for every step: a failed bind must not go unnoticed.
	if err != nil {
		if sub != nil {
			sub.Close()
		}
		gate.stop()
		return fmt.Errorf("kv events bind %s: %w", endpoint, err)
	}
	if gate != nil {
		gate.serve()
	} else if ep, err := sub.GetLastEndpoint(); err == nil {
		b.endpoint = ep
	}
	b.turn = &ingestTurn{x: b.index}
	b.wait = waitFor(sub, b.log)
	// Counting only: the publishers dial, and redial, a bound SUB.
	if b.mon, err = startMonitor(b.zctx, sub, b.stats, b.log, new(atomic.Bool), nil); err != nil {
		b.log.Warn("kv events: no socket monitor; dropped publisher connections are not counted", zap.Error(err))
	}
	go b.run(sub)
	return nil
}

// Endpoint is the bound endpoint (with the port the system chose for ":*").
func (b *BindListener) Endpoint() string { return b.endpoint }

// Stop ends the listener and waits until its connections, or its socket,
// are closed.
func (b *BindListener) Stop() {
	b.once.Do(func() {
		close(b.stop)
		b.wait.interrupt()
	})
	<-b.done
}

// parseTopic reads kv@<worker_id>@<model>, with SGLang's snapshot parts
// after it (baseTopic).
func parseTopic(topic string) (uint64, string, error) {
	topic, err := baseTopic(topic)
	if err != nil {
		return 0, "", err
	}
	parts := strings.SplitN(topic, "@", 3)
	if len(parts) != 3 || parts[0] != "kv" {
		return 0, "", errors.New("topic is not kv@<worker_id>@<model>")
	}
	id, err := strconv.ParseUint(parts[1], 10, 64)
	if err != nil {
		return 0, "", fmt.Errorf("topic worker id: %w", err)
	}
	if strconv.FormatUint(id, 10) != parts[1] {
		// One spelling per worker ("007" is not 7), so a publisher cannot
		// open streams without end by respelling one id.
		return 0, "", errors.New("topic worker id is not in canonical decimal form")
	}
	return id, parts[2], nil
}

// SGLang, when it serves snapshots of its cache (snapshot_endpoint),
// appends parts to its topic after a NUL byte: "\x00sgl-kv-epoch=<id>" on
// every live message (the id new with each publisher process), and
// "\x00sgl-kv-snapshot=<id>" after that on the empty batch that marks
// where a snapshot was taken. The gateway reads the live stream only (a
// snapshot holds hashes, not the tokens the index keys blocks by), and a
// new epoch's publisher starts its sequence again, which the stream
// already takes as a restart; so the parts are checked and set aside, and
// the worker's topic is what comes before them.
var sglangTopicParts = []string{"sgl-kv-epoch=", "sgl-kv-snapshot="}

// maxTopicPart bounds one such part's value (SGLang's ids are 32 hex
// digits; its own reader takes up to 256 bytes).
const maxTopicPart = 256

// baseTopic is topic without SGLang's parts, or an error when what
// follows a NUL byte is not one of them.
func baseTopic(topic string) (string, error) {
	base, rest, found := strings.Cut(topic, "\x00")
	for found {
		var part string
		part, rest, found = strings.Cut(rest, "\x00")
		known := false
		for _, p := range sglangTopicParts {
			if v, ok := strings.CutPrefix(part, p); ok && v != "" && len(v) <= maxTopicPart {
				known = true
			}
		}
		if !known {
			return "", errors.New("topic has a part after a NUL byte that is not SGLang's epoch or snapshot")
		}
	}
	return base, nil
}

// workerStats returns worker id's counts, made when first needed (b.mu held).
func (b *BindListener) workerStats(id uint64) *Stats {
	s := b.counts[id]
	if s == nil {
		s = b.stats.part()
		b.counts[id] = s
	}
	return s
}

// workerCounts copies every worker's counts.
func (b *BindListener) workerCounts() map[uint64]EventCounts {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[uint64]EventCounts, len(b.counts))
	for id, s := range b.counts {
		out[id] = s.Counts()
	}
	return out
}

// run receives from the SUB until Stop.
func (b *BindListener) run(sub *zmq.Socket) {
	defer close(b.done)
	defer b.mon.stop() // after the SUB is closed
	defer sub.Close()
	defer b.mon.detach(sub)
	defer b.gate.stop() // before the SUB closes: no publisher is passed to a closed SUB
	defer b.wait.close()
	receive(sub, b.wait, b.stop, nil, nil, b.stats, func(topic []byte, seq uint64, payload []byte) {
		b.route(topic, seq, payload, b.turn)
	}, b.turn.leave)
}

// route delivers one live message to the stream of the worker its topic
// names; turn is the calling goroutine's turn to ingest. Every message is
// resolved: a worker deleted from the catalog must stop feeding the index
// at once, and one that moved partitions starts a fresh sequence there.
func (b *BindListener) route(topic []byte, seq uint64, payload []byte, turn *ingestTurn) {
	id, model, err := parseTopic(string(topic))
	if err != nil {
		b.stats.Malformed.add(1)
		return
	}
	cfg, ok := b.resolve(id, model)
	if !ok {
		b.stats.Rejected.add(1)
		b.forget(id)
		return
	}
	if cfg.MaxGap == 0 {
		cfg.MaxGap = b.limits.maxGap
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = b.limits.maxMessageBytes
	}
	st := b.streamOf(id, cfg)
	if !st.mu.TryLock() {
		// The stream's holder may be waiting for an ingest turn: one held
		// here while waiting for the stream would deadlock the two
		// (TestBindConnectionsShareAWorker).
		turn.leave()
		st.mu.Lock()
	}
	defer st.mu.Unlock()
	st.turn = turn
	st.stats.Messages.add(1)
	st.deliver(seq, payload)
}

// streamOf returns worker id's stream for cfg, made afresh when the
// worker's record changed. Streams are kept per worker, so there are at
// most as many as the catalog has workers, whatever topics publishers send.
func (b *BindListener) streamOf(id uint64, cfg ListenerConfig) *bindStream {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.streams[id]
	if st == nil || st.cfg != cfg {
		st = &bindStream{stream: stream{cfg: cfg, zctx: b.zctx, index: b.index, stats: b.workerStats(id), log: b.log, stop: b.stop}}
		b.streams[id] = st
	}
	return st
}

// forget drops the stream and counts of a worker gone from the catalog.
func (b *BindListener) forget(id uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.streams, id)
	delete(b.counts, id)
}
