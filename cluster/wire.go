package cluster

import (
	"github.com/vmihailenco/msgpack/v5"
)

// The wire format: one message is an envelope, msgpack-encoded, holding a
// batch of events in the order they happened on its origin. Every envelope
// names its origin's settings fingerprint, build version and epoch; a new
// epoch means the origin announces its live bookings afresh, so its
// earlier ones are dropped first.

// Event kinds.
const (
	kindHeartbeat uint8 = iota + 1
	kindHello           // the sender (re)joined: every replica announces its bookings again
	kindReserve
	kindPrefill
	kindOutput
	kindFree
	kindHealth // a worker the sender took out (Down) or brought back
	kindApprox // blocks the sender's approximate index recorded as cached on a rank (in Hashes)
)

type envelope struct {
	Origin      string `msgpack:"o"`
	Fingerprint uint64 `msgpack:"f"`
	Version     string `msgpack:"v"`
	Epoch       uint64 `msgpack:"e"`
	// LeaseMs is the sender's lease, in milliseconds: how long the others
	// keep its bookings after its last message. Replicas may run other
	// heartbeats and leases, and one whose heartbeat outran a receiver's
	// lease was dropped between its heartbeats, again and again.
	LeaseMs uint64  `msgpack:"l,omitempty"`
	Events  []event `msgpack:"x"`
}

// event is one step of a booking's life, a heartbeat, a hello, a
// worker-health observation or an approximate-index record. Only the fields of its kind are set.
type event struct {
	Kind    uint8    `msgpack:"k"`
	ID      string   `msgpack:"i,omitempty"`
	Model   string   `msgpack:"m,omitempty"`
	Group   string   `msgpack:"g,omitempty"`
	Worker  uint64   `msgpack:"w,omitempty"`
	DPRank  uint32   `msgpack:"d,omitempty"`
	Hashes  []uint64 `msgpack:"h,omitempty"`
	Prefill uint64   `msgpack:"p,omitempty"`
	Outputs int      `msgpack:"n,omitempty"`
	Session string   `msgpack:"s,omitempty"`
	Decay   *float64 `msgpack:"y,omitempty"`
	Down    bool     `msgpack:"dn,omitempty"`
	// Digests, on every tenth heartbeat, summarise the sender's index.
	Digests []digest `msgpack:"dg,omitempty"`
}

// digest is one partition's selection.IndexDigest on the wire.
type digest struct {
	Partition string `msgpack:"p"`
	Entries   uint64 `msgpack:"n"`
	Xor       uint64 `msgpack:"x"`
}

// size is a cheap upper bound of e's encoded size, for batching.
func (e *event) size() int {
	return 64 + len(e.ID) + len(e.Model) + len(e.Group) + len(e.Session) + 9*len(e.Hashes)
}

func encode(env *envelope) ([]byte, error) { return msgpack.Marshal(env) }

// decode reads one message, its shape checked first (checkShape): no
// array or map in it may hold more than maxElems entries.
func decode(data []byte, env *envelope, maxElems int) error {
	if err := checkShape(data, maxElems); err != nil {
		return err
	}
	return msgpack.Unmarshal(data, env)
}
