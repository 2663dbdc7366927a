package indexer

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// A frameGate listens on a bind-mode endpoint for publishers. It bounds
// how many may be connected at once, closes those from an address that is
// no catalog worker's host (when it knows the catalog's hosts), and hands
// each connection, with the check of the topics it may send under
// (topicguard.go), to read, which
// serves it on a goroutine of its own (BindListener.read, bindpeer.go).
// Both cut a connection at the header of the first frame that makes a
// message longer than three frames or larger than the message bound,
// which libzmq alone cannot do. Bind mode is the one where any peer that
// reaches the port can publish, so it is where the gate stands; in
// connect mode the gateway dials only the publishers the operator
// registered.
//
// Without read (a benchmark's baseline, limits.relayed), the gate stands
// in front of a libzmq SUB instead, as it did before bind mode read its
// publishers itself: it passes each connection on to the SUB, bound on a
// socket file in a directory only this process's user can enter
// (behindSub), scanning the publisher's frames on the way (zmtpScan).

// liveFrameCount is the number of frames of a live message
// (docs/kv-events.md §2): a fourth is past the protocol, and the gate
// cuts the connection at its header.
const liveFrameCount = 3

// DefaultMaxPeers bounds the publishers connected to a bind-mode listener
// at once: four times a fleet of 1,024 one-rank workers, leaving room for
// publishers that reconnect before their old connection is seen to close.
const DefaultMaxPeers = 4096

// gateBuffer is how much of a publisher's stream the gate reads at a time.
const gateBuffer = 32 << 10

type frameGate struct {
	ln       net.Listener
	read     func(c net.Conn, guard *topicGuard) error // serves a publisher; nil: pass it to the SUB
	inner    string                                    // the SUB's socket file, alone in a private directory; "" without a SUB
	maxBytes int64                                     // one message, all frames; < 0 no bound
	maxPeers int
	hosts    *workerHosts // nil: any peer may send under any topic
	stats    *Stats
	log      *zap.Logger

	mu     sync.Mutex
	peers  map[net.Conn]struct{} // both ends of every pass, to close on stop
	open   int                   // publishers connected
	closed bool
	wg     sync.WaitGroup
	// warned is when a refused topic was last logged as a warning: a
	// misconfigured fleet is told, a flood does not fill the log.
	warned atomic.Int64
}

// topicWarnEvery spaces the warnings for refused topics.
const topicWarnEvery = 10 * time.Second

// gateNetwork maps a bind endpoint to what Go listens on; ok is false for
// an endpoint the gate does not stand in front of (inproc://: only this
// process can reach it).
func gateNetwork(endpoint string) (network, addr string, ok bool, err error) {
	switch {
	case strings.HasPrefix(endpoint, "tcp://"):
		hostPort := strings.TrimPrefix(endpoint, "tcp://")
		host, port, err := net.SplitHostPort(hostPort)
		if err != nil {
			return "", "", false, fmt.Errorf("kv events bind %s: %w", endpoint, err)
		}
		// libzmq's wildcards: "*" for every interface, and for a port
		// the system chooses.
		if host == "*" {
			host = ""
		}
		if port == "*" {
			port = "0"
		}
		return "tcp", net.JoinHostPort(host, port), true, nil
	case strings.HasPrefix(endpoint, "ipc://"):
		path := strings.TrimPrefix(endpoint, "ipc://")
		if path == "" || path == "*" {
			return "", "", false, fmt.Errorf("kv events bind %s: an ipc endpoint needs a path", endpoint)
		}
		return "unix", path, true, nil
	}
	return "", "", false, nil
}

// openGate listens on network/addr; serve starts accepting, once read is
// set or a SUB is bound behind the gate (behindSub).
func openGate(network, addr string, maxBytes int64, maxPeers int, hosts *workerHosts, stats *Stats, log *zap.Logger) (*frameGate, error) {
	ln, err := net.Listen(network, addr)
	if err != nil && network == "unix" && errors.Is(err, syscall.EADDRINUSE) && staleSocket(addr) {
		// A socket file left by a process that ended without removing it
		// (libzmq unlinks such a file before binding an ipc endpoint, so
		// a restart after a crash worked before the gate too).
		if rerr := os.Remove(addr); rerr == nil {
			ln, err = net.Listen(network, addr)
		}
	}
	if err != nil {
		return nil, err
	}
	return &frameGate{ln: ln, maxBytes: maxBytes, maxPeers: maxPeers, hosts: hosts, stats: stats, log: log,
		peers: map[net.Conn]struct{}{}}, nil
}

// staleSocket reports whether path is a socket file nothing listens on.
func staleSocket(path string) bool {
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSocket == 0 {
		return false
	}
	c, err := net.Dial("unix", path)
	if err == nil {
		c.Close()
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// behindSub makes the private directory of a SUB's socket file and
// returns the endpoint to bind the SUB on, behind the gate.
func (g *frameGate) behindSub() (string, error) {
	// MkdirTemp makes the directory 0700: no other user can reach the
	// SUB behind the gate.
	dir, err := os.MkdirTemp("", "kvrouter-events-")
	if err != nil {
		return "", err
	}
	g.inner = filepath.Join(dir, "sub")
	return "ipc://" + g.inner, nil
}

// endpoint is the gate's address in libzmq's spelling.
func (g *frameGate) endpoint() string {
	a := g.ln.Addr()
	if a.Network() == "unix" {
		return "ipc://" + a.String()
	}
	return "tcp://" + a.String()
}

// serve accepts publishers until stop.
func (g *frameGate) serve() {
	g.wg.Go(func() {
		for {
			c, err := g.ln.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				// A transient failure (out of descriptors): the next
				// Accept may do better.
				g.log.Warn("kv events: accepting a publisher", zap.Error(err))
				continue
			}
			g.admit(c)
		}
	})
}

// admit starts passing c's stream to the SUB, unless the gate already
// holds maxPeers publishers or is stopping.
func (g *frameGate) admit(c net.Conn) {
	g.mu.Lock()
	if g.closed || g.open >= g.maxPeers {
		g.mu.Unlock()
		if !g.closed {
			g.stats.TurnedAway.add(1)
		}
		c.Close()
		return
	}
	g.open++
	g.peers[c] = struct{}{}
	g.mu.Unlock()
	g.wg.Go(func() {
		defer g.leave(c)
		guard := g.guard(c)
		if guard != nil && !guard.hosts.knownPeer(guard.peer) {
			g.cutOff(c, fmt.Errorf("%w: %s is no catalog worker's host", errTopic, guard.peer))
			return
		}
		if g.read == nil {
			g.pass(c)
			return
		}
		g.ended(c, g.read(c, guard))
	})
}

// leave closes a publisher's connection and gives its place back.
func (g *frameGate) leave(c net.Conn) {
	g.mu.Lock()
	delete(g.peers, c)
	g.open--
	g.mu.Unlock()
	c.Close()
}

// ended counts a served connection that is over: cut for what it sent,
// or dropped (a publisher that went away, or one that did not greet as a
// publisher in time); not when the gate is stopping.
func (g *frameGate) ended(c net.Conn, err error) {
	switch {
	case errors.Is(err, errZMTP) || errors.Is(err, errTopic):
		g.cutOff(c, err)
	case errors.Is(err, errStopping):
	default:
		g.mu.Lock()
		closed := g.closed
		g.mu.Unlock()
		if !closed {
			g.stats.Disconnects.add(1)
			g.log.Debug("kv events: publisher connection dropped", zap.String("peer", c.RemoteAddr().String()), zap.Error(err))
		}
	}
}

// pass joins the publisher's connection to one of its own to the SUB.
func (g *frameGate) pass(pubConn net.Conn) {
	subConn, err := net.Dial("unix", g.inner)
	if err != nil {
		g.log.Warn("kv events: reaching the subscriber behind the gate", zap.Error(err))
		return
	}
	if !g.track(subConn) {
		subConn.Close()
		return
	}
	defer g.untrack(subConn)
	// The SUB's side (its greeting, READY and subscription) is passed as
	// it is: it comes from libzmq in this process.
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(pubConn, subConn)
		// The SUB hung up (libzmq refused the publisher, or it is
		// closing): so does the publisher's side.
		pubConn.Close()
	}()
	g.forward(pubConn, subConn)
	subConn.Close()
	<-done
}

// forward passes what the publisher sends to the SUB, scanning it first.
func (g *frameGate) forward(pubConn, subConn net.Conn) {
	scan := newZMTPScan(liveFrameCount, g.maxBytes)
	if guard := g.guard(pubConn); guard != nil {
		scan.onTopic = guard.check
	}
	buf := make([]byte, gateBuffer)
	for {
		n, err := pubConn.Read(buf)
		if n > 0 {
			if serr := scan.scan(buf[:n]); serr != nil {
				// Hanging up on libzmq with a message half sent makes it
				// drop the frames it holds of that message (a topic is
				// its first frame).
				g.cutOff(pubConn, serr)
				return
			}
			if _, werr := subConn.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// guard returns the topic check of a publisher's connection: nil when any
// peer may send under any topic, or for a socket-file peer, which has no
// address to check (the file's permissions say who may dial it).
func (g *frameGate) guard(c net.Conn) *topicGuard {
	if g.hosts == nil {
		return nil
	}
	a, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return nil
	}
	return &topicGuard{peer: a.AddrPort().Addr().Unmap(), hosts: g.hosts}
}

// cutOff counts a connection cut for err and logs it: a refused topic as a
// warning (spaced by topicWarnEvery), since an honest fleet whose events
// come from other addresses than its workers' endpoints lands there.
func (g *frameGate) cutOff(c net.Conn, err error) {
	peer := zap.String("peer", c.RemoteAddr().String())
	if !errors.Is(err, errTopic) {
		g.stats.Cut.add(1)
		g.log.Debug("kv events: publisher cut off", peer, zap.Error(err))
		return
	}
	g.stats.WrongTopic.add(1)
	now, last := time.Now().UnixNano(), g.warned.Load()
	if now-last >= int64(topicWarnEvery) && g.warned.CompareAndSwap(last, now) {
		g.log.Warn("kv events: publisher cut off for its topic (kv_events_bind_peers any lets every peer send under any topic)", peer, zap.Error(err))
		return
	}
	g.log.Debug("kv events: publisher cut off for its topic", peer, zap.Error(err))
}

// track adds the SUB's end of a pass to those closed on stop; false when
// the gate is stopping.
func (g *frameGate) track(c net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.peers[c] = struct{}{}
	return true
}

func (g *frameGate) untrack(c net.Conn) {
	g.mu.Lock()
	delete(g.peers, c)
	g.mu.Unlock()
}

// stop closes the gate and every pass, and waits for their goroutines.
func (g *frameGate) stop() {
	if g == nil {
		return
	}
	// The listener first, so that the port is free as soon as the gate
	// stops; then the connections, outside the mutex: closing one waits
	// for its reader's callback to return, and the accept loop and the
	// readers that end meanwhile take the mutex.
	g.ln.Close()
	g.mu.Lock()
	g.closed = true
	peers := make([]net.Conn, 0, len(g.peers))
	for c := range g.peers {
		peers = append(peers, c)
	}
	g.mu.Unlock()
	for _, c := range peers {
		c.Close()
	}
	g.wg.Wait()
	if g.inner != "" {
		os.RemoveAll(filepath.Dir(g.inner))
	}
}
