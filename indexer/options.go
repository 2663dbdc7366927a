package indexer

// The limits a Manager puts on what publishers send it (docs/kv-events.md
// §9 lists them all).

// DefaultMaxMessageBytes bounds one ZMQ message a listener accepts, all
// its frames together, from the frame headers, before a larger frame is
// read: a publisher's connection is cut by its reader (zmtpconn.go, in
// connect and in bind mode), and libzmq bounds each frame of a replay
// reply. An engine publishes one batch per scheduler step, and a step
// prefills at most its token budget (vLLM's chunked prefill: 8–16k
// tokens, about 60 KB of events); 4 MiB holds the blocks of a whole
// prompt of several hundred thousand tokens stored in one step. A
// publisher can make the gateway hold one message; one read through a
// libzmq SUB (an inproc:// endpoint, the connect-mode fallback), the SUB's
// queue of subQueue messages, 256 MiB (docs/kv-events.md §9).
const DefaultMaxMessageBytes = 4 << 20

// DefaultMaxGap is the largest live sequence jump taken as lost events: ten
// times vLLM's default replay buffer of 10,000 batches. A larger jump is a
// restarted or lying publisher, whose rank starts afresh.
const DefaultMaxGap = 100_000

// limits are a manager's settings for its listeners.
type limits struct {
	maxMessageBytes int64
	maxGap          uint64
	maxPeers        int
	bindPeers       BindPeers
	// ungated binds the SUB where the publishers dial, without a frame
	// gate: a benchmark's baseline only.
	ungated bool
	// relayed puts the gate in front of a libzmq SUB, as before bind
	// mode read its publishers itself: a benchmark's baseline only.
	relayed bool
	// workerHosts lists the catalog's workers' hosts (WithWorkerHosts);
	// nil: a connection's address is checked at its first topic only.
	workerHosts func() []string
}

func defaultLimits() limits {
	return limits{maxMessageBytes: DefaultMaxMessageBytes, maxGap: DefaultMaxGap, maxPeers: DefaultMaxPeers}
}

func (l *limits) apply(opts []ManagerOption) {
	for _, o := range opts {
		if o != nil {
			o(l)
		}
	}
}

// ManagerOption sets a limit of a Manager (NewManager) or of a bind-mode
// listener (StartBindListener).
type ManagerOption func(*limits)

// WithMaxMessageBytes bounds one ZMQ message (libzmq's ZMQ_MAXMSGSIZE) on
// every socket that receives KV events; 0 keeps DefaultMaxMessageBytes and
// a negative n lifts the bound.
func WithMaxMessageBytes(n int64) ManagerOption {
	return func(l *limits) {
		if n != 0 {
			l.maxMessageBytes = n
		}
	}
}

// WithMaxGap sets the largest live sequence jump taken as lost events
// rather than as a restart; 0 keeps DefaultMaxGap.
func WithMaxGap(n uint64) ManagerOption {
	return func(l *limits) {
		if n != 0 {
			l.maxGap = n
		}
	}
}

// WithMaxPeers bounds the publishers connected to a bind-mode listener
// at once; a further connection is closed and counted (Stats.TurnedAway).
// 0 keeps DefaultMaxPeers.
func WithMaxPeers(n int) ManagerOption {
	return func(l *limits) {
		if n > 0 {
			l.maxPeers = n
		}
	}
}

// WithBindPeers says which publishers may send under a worker's topic
// to a bind-mode listener (topicguard.go); PeersWorkerHost, the zero
// value, is the default.
func WithBindPeers(p BindPeers) ManagerOption {
	return func(l *limits) { l.bindPeers = p }
}

// maxMsgSize is the ZMQ_MAXMSGSIZE value for n (ListenerConfig's
// convention: 0 the default, negative no bound, which libzmq spells -1).
func maxMsgSize(n int64) int64 {
	switch {
	case n == 0:
		return DefaultMaxMessageBytes
	case n < 0:
		return -1
	}
	return n
}
