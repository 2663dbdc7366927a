package indexer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Who may publish under a worker's topic in bind mode. A topic names the
// worker whose index the events change, and any peer that reaches the
// bound endpoint can dial it: without a check, one publisher could write
// blocks into every worker's cache, or remove them. ZMTP's NULL mechanism,
// the one engines speak, carries no identity, so the gate ties what it
// can see to what the catalog says: a connection's source address to the
// host of the worker its topic names, and the connection to that one
// topic (docs/kv-events.md §1).

// BindPeers says which bind-mode publishers may send under a worker's
// topic.
type BindPeers uint8

const (
	// PeersWorkerHost lets a TCP connection send under one topic only,
	// that of a worker in the catalog whose endpoint's host is the
	// connection's source address (a host name is resolved). The default.
	PeersWorkerHost BindPeers = iota
	// PeersAny lets any connection send under any topic; the listener
	// still drops the messages of workers the catalog does not know.
	PeersAny
)

// errTopic marks a connection cut for its topic (Stats.WrongTopic).
var errTopic = errors.New("kv events publisher topic")

// topicGuard checks one connection's topics.
type topicGuard struct {
	peer   netip.Addr
	hosts  *workerHosts
	pinned []byte // the topic the connection was let send; nil before its first
}

// check lets topic pass or says why the connection is cut. The first
// topic is checked against the catalog; every later one must name the
// same worker (SGLang's snapshot parts aside: baseTopic).
func (g *topicGuard) check(topic []byte) error {
	base := topic
	if i := bytes.IndexByte(topic, 0); i >= 0 {
		if _, err := baseTopic(string(topic)); err != nil {
			return fmt.Errorf("%w %q: %v", errTopic, topic, err)
		}
		base = topic[:i]
	}
	if g.pinned != nil {
		if bytes.Equal(base, g.pinned) {
			return nil
		}
		return fmt.Errorf("%w: %q after %q on one connection", errTopic, topic, g.pinned)
	}
	if err := g.hosts.allow(string(base), g.peer); err != nil {
		return err
	}
	g.pinned = bytes.Clone(base)
	return nil
}

// hostLookupTimeout bounds one resolution of a worker's host name; the
// connection's stream waits for it.
const hostLookupTimeout = 2 * time.Second

// hostAnswerTTL is how long a host name's addresses are kept: a peer
// that dials again and again costs one lookup per name in that time.
const hostAnswerTTL = 30 * time.Second

// hostAnswersKept bounds the cache; names come from the catalog, which
// the control plane writes, so this is a backstop.
const hostAnswersKept = 4096

// workerHosts decides whether a peer may send under a topic, from the
// catalog (resolve) and the worker's host's addresses (lookup, cached),
// and, when it can list the catalog's hosts (list), whether a peer may
// connect at all.
type workerHosts struct {
	resolve Resolver
	list    func() []string // nil: peers are checked at their first topic only
	lookup  func(ctx context.Context, host string) ([]netip.Addr, error)
	// flight makes the peers that dial at once for one name wait for one
	// lookup, where each would have sent its own.
	flight singleflight.Group

	mu      sync.Mutex
	answers map[string]hostAnswer
	peers   peerSet // the addresses of every catalog worker's host
}

// peerSet is the addresses of the catalog's workers' hosts, as of made.
type peerSet struct {
	addrs map[netip.Addr]struct{}
	made  time.Time
}

// peerSetAge is how old the set may be before a peer it does not hold has
// it made again: a worker registered meanwhile waits at most this long
// (its publisher dials again), and peers that are no worker's host make
// the gateway list the catalog at most once in it.
const peerSetAge = time.Second

// WithWorkerHosts gives a bind-mode listener the hosts of the catalog's
// workers (HostsFor): under kv_events_bind_peers worker_host, a TCP
// connection from an address that is none of theirs is closed before its
// handshake, rather than at its first topic. Without it, a stranger that
// greeted and then sent nothing held one of kv_events_max_peers for as
// long as it liked.
func WithWorkerHosts(list func() []string) ManagerOption {
	return func(l *limits) { l.workerHosts = list }
}

// knownPeer reports whether peer is the address of some catalog worker's
// host (always true without list).
func (w *workerHosts) knownPeer(peer netip.Addr) bool {
	if w.list == nil {
		return true
	}
	w.mu.Lock()
	set := w.peers
	w.mu.Unlock()
	if _, ok := set.addrs[peer]; ok {
		return true
	}
	if time.Since(set.made) < peerSetAge {
		return false
	}
	v, _, _ := w.flight.Do("\x00peers", func() (any, error) {
		addrs := map[netip.Addr]struct{}{}
		seen := map[string]bool{}
		for _, host := range w.list() {
			if seen[host] {
				continue
			}
			seen[host] = true
			found, _ := w.addrsOf(host)
			for _, a := range found {
				addrs[a.Unmap()] = struct{}{}
			}
		}
		set := peerSet{addrs: addrs, made: time.Now()}
		w.mu.Lock()
		w.peers = set
		w.mu.Unlock()
		return set, nil
	})
	_, ok := v.(peerSet).addrs[peer]
	return ok
}

type hostAnswer struct {
	addrs []netip.Addr
	err   error
	until time.Time
}

func newWorkerHosts(resolve Resolver, list func() []string) *workerHosts {
	return &workerHosts{resolve: resolve, list: list, answers: map[string]hostAnswer{},
		lookup: func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}}
}

// allow returns nil when a peer at address peer may send under topic.
func (w *workerHosts) allow(topic string, peer netip.Addr) error {
	id, model, err := parseTopic(topic)
	if err != nil {
		return fmt.Errorf("%w %q: %v", errTopic, topic, err)
	}
	cfg, ok := w.resolve(id, model)
	if !ok {
		return fmt.Errorf("%w %q: no worker %d of model %q in the catalog", errTopic, topic, id, model)
	}
	host := workerHost(cfg.WorkerEndpoint)
	addrs, err := w.addrsOf(host)
	if err != nil {
		return fmt.Errorf("%w %q: worker %d's host %q: %v", errTopic, topic, id, host, err)
	}
	for _, a := range addrs {
		if a.Unmap() == peer {
			return nil
		}
	}
	return fmt.Errorf("%w %q: sent from %s, not from worker %d's host %q", errTopic, topic, peer, id, host)
}

// workerHost is the host of a worker's HTTP endpoint (host:port, with or
// without a scheme).
func workerHost(endpoint string) string {
	hp := selection.HostPort(endpoint)
	if host, _, err := net.SplitHostPort(hp); err == nil {
		return host
	}
	return hp
}

// addrsOf returns host's addresses: itself when it is an address, else
// the resolver's answer, kept for hostAnswerTTL (a failure too, so that
// a peer cannot make the gateway ask again at every dial).
func (w *workerHosts) addrsOf(host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a.Unmap()}, nil
	}
	w.mu.Lock()
	ans, ok := w.answers[host]
	w.mu.Unlock()
	if !ok || !time.Now().Before(ans.until) {
		v, _, _ := w.flight.Do(host, func() (any, error) {
			ctx, cancel := context.WithTimeout(context.Background(), hostLookupTimeout)
			addrs, err := w.lookup(ctx, host)
			cancel()
			ans := hostAnswer{addrs: addrs, err: err, until: time.Now().Add(hostAnswerTTL)}
			w.mu.Lock()
			if len(w.answers) >= hostAnswersKept {
				clear(w.answers)
			}
			w.answers[host] = ans
			w.mu.Unlock()
			return ans, nil
		})
		ans = v.(hostAnswer)
	}
	return ans.addrs, ans.err
}
