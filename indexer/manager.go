package indexer

import (
	"fmt"
	"sync"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Manager keeps one listener per worker rank in step with the catalog: it
// is the selection router's catalog hook. It owns the one ZMQ context all
// its sockets share.
type Manager struct {
	Index *Index
	stats Stats // the listeners' counters; read them with Stats

	zctx   *zmq.Context
	log    *zap.Logger
	limits limits

	mu        sync.Mutex
	listeners map[selection.Rank]*Listener
	bind      *BindListener
	closed    bool
}

// maxSockets is the socket limit of a manager's ZMQ context. libzmq's
// default of 1,023 would make the 342nd worker rank's listener fail to
// start, while the catalog takes up to 65,536 workers; a manager holds
// three sockets per rank (the SUB and its monitor's two PAIRs) and,
// during a replay, a DEALER as well. So the limit is
// libzmq's own ceiling (ZMQ_SOCKET_LIMIT with epoll), and the real bound is
// the process's file descriptors (each socket holds an eventfd and, once
// connected, a TCP connection). The cost is the context's slot table, about
// 12 bytes per allowed socket, allocated when the first socket is created.
const maxSockets = 65535

// NewManager returns a manager feeding index. Its options bound what
// publishers may send (WithMaxMessageBytes, WithMaxGap); without them the
// defaults apply (DefaultMaxMessageBytes, DefaultMaxGap).
func NewManager(index *Index, log *zap.Logger, opts ...ManagerOption) (*Manager, error) {
	if log == nil {
		log = zap.NewNop()
	}
	lim := defaultLimits()
	lim.apply(opts)
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, err
	}
	if err := zctx.SetMaxSockets(maxSockets); err != nil {
		// A libzmq built on poll or select clips the limit to FD_SETSIZE;
		// the default still serves up to a thousand ranks.
		log.Warn("cannot raise the ZMQ socket limit; at most about 1,000 worker ranks can be followed",
			zap.Int("wanted", maxSockets), zap.Error(err))
	}
	return &Manager{Index: index, zctx: zctx, log: log, limits: lim, listeners: map[selection.Rank]*Listener{}}, nil
}

// desired lists the listeners a record calls for.
func (m *Manager) desired(rec *selection.WorkerRecord) map[selection.Rank]ListenerConfig {
	out := map[selection.Rank]ListenerConfig{}
	if rec == nil || rec.BlockSize == nil || *rec.BlockSize == 0 {
		return out
	}
	for _, r := range rec.Ranks() {
		ep := rec.EventEndpoint(r.DPRank)
		if !selection.ValidZMQEndpoint(ep) {
			continue
		}
		out[r] = ListenerConfig{Endpoint: ep, Replay: rec.ReplayFor(), Partition: rec.Partition(), Rank: r,
			FirstRank: rec.DataParallelStartRank, RankCount: rec.DataParallelSize,
			MaxMessageBytes: m.limits.maxMessageBytes, MaxGap: m.limits.maxGap, WorkerEndpoint: deref(rec.Endpoint)}
	}
	return out
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// OnCatalogChange follows a catalog change (selection.WithCatalogHook):
// listeners whose settings did not change keep running (and their
// sequence state); changed ones are replaced; departed ones stopped. A
// worker whose HTTP endpoint changed is a different server: all its
// listeners start afresh, even on the same ZMQ endpoints, and its index
// entries are dropped, so no prompt is sent to the new server for what
// the old one cached.
func (m *Manager) OnCatalogChange(old, cur *selection.WorkerRecord) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	if cur != nil && cur.BlockSize != nil && *cur.BlockSize > 0 {
		m.Index.ConfigurePartition(cur.Partition(), int(*cur.BlockSize), cur.IsEagle != nil && *cur.IsEagle)
	}
	want := m.desired(cur)
	id := uint64(0)
	switch {
	case cur != nil:
		id = cur.WorkerID
	case old != nil:
		id = old.WorkerID
	}
	moved := old != nil && cur != nil && deref(old.Endpoint) != deref(cur.Endpoint)
	for r, l := range m.listeners {
		if r.WorkerID != id {
			continue
		}
		if cfg, ok := want[r]; ok && cfg == l.Config() && !moved {
			delete(want, r) // unchanged: keep it
			continue
		}
		l.Stop()
		delete(m.listeners, r)
	}
	if moved {
		// After the listeners stopped, so that no event of theirs lands
		// once the entries are gone.
		m.Index.RemoveWorker(old.Partition(), id)
	}
	for r, cfg := range want {
		// Its own counts, each also added to the manager's totals.
		l, err := StartListener(m.zctx, m.Index, m.stats.part(), m.log, cfg)
		if err != nil {
			m.log.Error("starting kv event listener", zap.Uint64("worker_id", r.WorkerID), zap.Uint32("dp_rank", r.DPRank), zap.Error(err))
			continue
		}
		m.listeners[r] = l
	}
}

// WorkerCounts returns, by worker id, what each worker's publishers
// raised: its per-rank listeners' counts summed and, in bind mode, its
// stream's. Counts of connections a bind-mode gate refused belong to no
// worker and show in the totals (Snapshot) only, as do those of a worker
// since removed.
func (m *Manager) WorkerCounts() map[uint64]EventCounts {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[uint64]EventCounts{}
	for r, l := range m.listeners {
		out[r.WorkerID] = out[r.WorkerID].plus(l.stats.Counts())
	}
	if m.bind != nil {
		for id, c := range m.bind.workerCounts() {
			out[id] = out[id].plus(c)
		}
	}
	return out
}

// Listeners returns how many per-rank listeners run.
func (m *Manager) Listeners() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.listeners)
}

// Bind starts the bind-mode listener on endpoint; resolve maps a topic's
// worker to its catalog record.
func (m *Manager) Bind(endpoint string, resolve Resolver, opts ...ManagerOption) (*BindListener, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("manager closed")
	}
	if m.bind != nil {
		return nil, fmt.Errorf("already bound to %s", m.bind.Endpoint())
	}
	// The manager's limits whole, so that a limit added later reaches the
	// bind listener without being named here.
	b, err := StartBindListener(m.zctx, m.Index, &m.stats, m.log, endpoint, resolve,
		append([]ManagerOption{func(l *limits) { *l = m.limits }}, opts...)...)
	if err != nil {
		return nil, err
	}
	m.bind = b
	return b, nil
}

// Close stops every listener and ends the ZMQ context.
func (m *Manager) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	// Stop waits for the listener's goroutine to close its socket, and
	// one whose descriptor cannot be polled notices Stop only when its
	// receive times out (100 ms): one after the other, a thousand ranks
	// could take a minute.
	var wg sync.WaitGroup
	for r, l := range m.listeners {
		wg.Go(l.Stop)
		delete(m.listeners, r)
	}
	wg.Wait()
	if m.bind != nil {
		m.bind.Stop()
	}
	return m.zctx.Term()
}

// HostsFor lists the hosts of r's catalog workers' endpoints, for
// WithWorkerHosts.
func HostsFor(r *selection.Router) func() []string {
	return func() []string {
		workers := r.Catalog().ListWorkers("", "")
		hosts := make([]string, 0, len(workers))
		for _, w := range workers {
			if w.Endpoint != nil {
				hosts = append(hosts, workerHost(*w.Endpoint))
			}
		}
		return hosts
	}
}

// ResolverFor builds a bind-mode resolver over a router's catalog.
func ResolverFor(r *selection.Router) Resolver {
	return func(workerID uint64, model string) (ListenerConfig, bool) {
		rec, ok := r.Catalog().Worker(workerID)
		if !ok || rec.ModelName != model || rec.BlockSize == nil {
			return ListenerConfig{}, false
		}
		return ListenerConfig{Replay: rec.ReplayFor(), Partition: rec.Partition(),
			Rank:      selection.Rank{WorkerID: workerID, DPRank: rec.DataParallelStartRank},
			FirstRank: rec.DataParallelStartRank, RankCount: rec.DataParallelSize, WorkerEndpoint: deref(rec.Endpoint)}, true
	}
}
