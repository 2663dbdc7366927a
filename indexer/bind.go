package indexer

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

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

	stop    chan struct{}
	wait    *readWait  // nil: receives block with a timeout instead
	mon     *monitor   // nil when the socket monitor could not start
	gate    *frameGate // nil for an inproc:// endpoint
	done    chan struct{}
	once    sync.Once
	streams map[uint64]*stream // by worker id; owned by the goroutine
	// counts are each worker's streams' counts, kept across a stream's
	// replacement (its worker's record changed) and dropped when a message
	// finds the worker gone from the catalog (one of a few hundred bytes
	// per worker the catalog ever held meanwhile); read by the admin route
	// through Manager.WorkerCounts.
	countsMu sync.Mutex
	counts   map[uint64]*Stats
	turn     *ingestTurn // the goroutine's turn to ingest, shared by its streams
}

// StartBindListener binds endpoint and starts receiving. Its options set
// the message size bound and the largest sequence gap (WithMaxMessageBytes,
// WithMaxGap), for every publisher whose resolved ListenerConfig leaves
// them 0, and the bound of publishers connected at once (WithMaxPeers).
// A tcp:// or ipc:// endpoint is served by a frame gate (framegate.go);
// the SUB behind it is bound on a socket file of its own.
func StartBindListener(zctx *zmq.Context, index *Index, stats *Stats, log *zap.Logger, endpoint string, resolve Resolver, opts ...ManagerOption) (*BindListener, error) {
	if log == nil {
		log = zap.NewNop()
	}
	lim := defaultLimits()
	lim.apply(opts)
	sub, err := zctx.NewSocket(zmq.SUB)
	if err != nil {
		return nil, err
	}
	// The gate listens where the SUB would have been bound, and the SUB
	// is bound behind it (framegate.go).
	var gate *frameGate
	inner := endpoint
	network, addr, gated, err := gateNetwork(endpoint)
	if err == nil && gated && !lim.ungated {
		var hosts *workerHosts
		if lim.bindPeers == PeersWorkerHost {
			hosts = newWorkerHosts(resolve)
		}
		if gate, err = openGate(network, addr, lim.maxMessageBytes, lim.maxPeers, hosts, stats, log); err == nil {
			inner = gate.innerEndpoint()
		}
	}
	// One err for every step: a failed bind must not go unnoticed.
	if err == nil {
		if err = setupSub(sub, lim.maxMessageBytes); err == nil {
			err = sub.Bind(inner)
		}
	}
	if err != nil {
		sub.Close()
		if gate != nil {
			gate.stop()
		}
		return nil, fmt.Errorf("kv events bind %s: %w", endpoint, err)
	}
	if gate != nil {
		endpoint = gate.endpoint()
		gate.serve()
	} else if ep, err := sub.GetLastEndpoint(); err == nil {
		endpoint = ep
	}
	b := &BindListener{zctx: zctx, index: index, stats: stats, log: log, resolve: resolve, endpoint: endpoint, limits: lim, gate: gate,
		stop: make(chan struct{}), done: make(chan struct{}), streams: map[uint64]*stream{}, counts: map[uint64]*Stats{}, turn: &ingestTurn{x: index}}
	b.wait = waitFor(sub, log)
	// Counting only: the publishers dial, and redial, a bound SUB.
	if b.mon, err = startMonitor(zctx, sub, stats, log, nil); err != nil {
		log.Warn("kv events: no socket monitor; dropped publisher connections are not counted", zap.Error(err))
	}
	go b.run(sub)
	return b, nil
}

// Endpoint is the bound endpoint (with the port the system chose for ":*").
func (b *BindListener) Endpoint() string { return b.endpoint }

// Stop ends the listener and waits until its socket is closed.
func (b *BindListener) Stop() {
	b.once.Do(func() {
		close(b.stop)
		b.wait.interrupt()
	})
	<-b.done
}

// parseTopic reads kv@<worker_id>@<model>.
func parseTopic(topic string) (uint64, string, error) {
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

// workerStats returns worker id's counts, made when first needed.
func (b *BindListener) workerStats(id uint64) *Stats {
	b.countsMu.Lock()
	defer b.countsMu.Unlock()
	s := b.counts[id]
	if s == nil {
		s = b.stats.part()
		b.counts[id] = s
	}
	return s
}

// workerCounts copies every worker's counts.
func (b *BindListener) workerCounts() map[uint64]EventCounts {
	b.countsMu.Lock()
	defer b.countsMu.Unlock()
	out := make(map[uint64]EventCounts, len(b.counts))
	for id, s := range b.counts {
		out[id] = s.Counts()
	}
	return out
}

func (b *BindListener) run(sub *zmq.Socket) {
	defer close(b.done)
	defer b.mon.stop() // after the SUB is closed, which ends its monitoring
	defer sub.Close()
	defer b.gate.stop() // before the SUB closes: no publisher is passed to a closed SUB
	defer b.wait.close()
	receive(sub, b.wait, b.stop, nil, nil, b.stats, func(topic []byte, seq uint64, payload []byte) {
		// Resolve every message: a worker deleted from the catalog must
		// stop feeding the index at once, and one that moved partitions
		// starts a fresh sequence there.
		id, model, err := parseTopic(string(topic))
		if err != nil {
			b.stats.Malformed.add(1)
			return
		}
		cfg, ok := b.resolve(id, model)
		if !ok {
			b.stats.Rejected.add(1)
			delete(b.streams, id)
			b.countsMu.Lock()
			delete(b.counts, id)
			b.countsMu.Unlock()
			return
		}
		if cfg.MaxGap == 0 {
			cfg.MaxGap = b.limits.maxGap
		}
		if cfg.MaxMessageBytes == 0 {
			cfg.MaxMessageBytes = b.limits.maxMessageBytes
		}
		// Streams are kept per worker, so there are at most as many as
		// the catalog has workers, whatever topics publishers send.
		st := b.streams[id]
		if st == nil || st.cfg != cfg {
			st = &stream{cfg: cfg, zctx: b.zctx, index: b.index, stats: b.workerStats(id), log: b.log, stop: b.stop, turn: b.turn}
			b.streams[id] = st
		}
		st.stats.Messages.add(1)
		st.deliver(seq, payload)
	}, b.turn.leave)
}
