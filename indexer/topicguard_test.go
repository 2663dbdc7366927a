package indexer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// topicWorkers are the workers of the topic tests: 5 on another host
// than the tests' publishers (127.0.0.2: loopback, but another address),
// 6 on theirs with a scheme in its endpoint, 7 on theirs by name.
func topicWorkers(t *testing.T, r *selection.Router) {
	t.Helper()
	for id, ep := range map[uint64]string{5: "127.0.0.2:8000", 6: "http://127.0.0.1:8000/", 7: "localhost:8000"} {
		if _, err := r.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: ptr(id), ModelName: ptr("m"),
			Endpoint: ptr(ep), BlockSize: ptr(uint32(lbs))}); err != nil {
			t.Fatal(err)
		}
	}
}

// publisherFrom returns a PUB that dials b from source address src
// (libzmq's "tcp://source;destination"), redialing every 50 ms.
func publisherFrom(t *testing.T, b *BindListener, src string) func(topic string, seq uint64, payload []byte) {
	t.Helper()
	pctx, _ := zmq.NewContext()
	pub, _ := pctx.NewSocket(zmq.PUB)
	_ = pub.SetLinger(0)
	_ = pub.SetReconnectIvl(50 * time.Millisecond)
	t.Cleanup(func() { pub.Close(); _ = pctx.Term() })
	if err := pub.Connect("tcp://" + src + ":0;" + strings.TrimPrefix(b.Endpoint(), "tcp://")); err != nil {
		t.Fatal(err)
	}
	return func(topic string, seq uint64, payload []byte) {
		if _, err := pub.SendMessage(topic, binary.BigEndian.AppendUint64(nil, seq), payload); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBindGateChecksTopics: under PeersWorkerHost (the default), a real
// libzmq publisher is heard under the topic of a worker whose endpoint's
// host is its address, by address or by name; a publisher on another
// address, one under a topic naming no worker (or not a topic at all),
// and a heard connection that goes on to a second worker's topic are cut
// off and counted, and nothing they sent reaches the index. Under
// PeersAny the publisher of the wrong host is heard.
func TestBindGateChecksTopics(t *testing.T) {
	key := selection.PartitionKey{Model: "m", Group: "default"}
	prompt := testPrompt(31)
	t.Run("worker_host", func(t *testing.T) {
		r, m := eventRouter(t, true)
		topicWorkers(t, r)
		b, err := m.Bind("tcp://127.0.0.1:*", ResolverFor(r))
		if err != nil {
			t.Fatal(err)
		}
		blocks := func(id uint64) int { return m.Index.Blocks(key, selection.Rank{WorkerID: id}) }
		// Heard: each worker from its own host. The connection is
		// asynchronous: send until the batch lands, under a new sequence
		// each time (a repeated one would be taken as a restart).
		seq := map[string]uint64{}
		heard := func(send func(string, uint64, []byte), topic string, id uint64, to int) {
			t.Helper()
			eventually(t, topic+" heard", func() bool {
				send(topic, seq[topic], chunk(EncodingArray, -1, prompt, 0, to))
				seq[topic]++
				return blocks(id) == to
			})
		}
		from2 := publisherFrom(t, b, "127.0.0.2")
		heard(from2, "kv@5@m", 5, 4)
		heard(publisherFrom(t, b, "127.0.0.1"), "kv@6@m", 6, 4)
		heard(publisherFrom(t, b, "127.0.0.1"), "kv@7@m", 7, 4)
		if got := m.stats.WrongTopic.Load(); got != 0 {
			t.Fatalf("wrong topic %d before any was sent", got)
		}
		// Cut: each sends until the gate has cut it once.
		cut := func(what string, send func(string, uint64, []byte), topic string) {
			t.Helper()
			before := m.stats.WrongTopic.Load()
			eventually(t, what+" cut", func() bool {
				send(topic, seq[topic], chunk(EncodingArray, -1, prompt, 0, 8))
				seq[topic]++
				return m.stats.WrongTopic.Load() > before
			})
		}
		cut("another host's publisher", publisherFrom(t, b, "127.0.0.1"), "kv@5@m")
		cut("a second topic on one connection", from2, "kv@6@m")
		cut("a worker the catalog does not know", publisherFrom(t, b, "127.0.0.1"), "kv@9@m")
		cut("not a topic", publisherFrom(t, b, "127.0.0.1"), "not-a-topic")
		// Worker 5's own publisher is heard again once it has redialed.
		heard(from2, "kv@5@m", 5, 12)
		if blocks(6) != 4 || blocks(9) != 0 {
			t.Fatalf("blocks: worker 6 %d, worker 9 %d: a cut message reached the index", blocks(6), blocks(9))
		}
		if c := m.stats.Counts(); c.Malformed != 0 || c.Rejected != 0 || c.Cut != 0 {
			t.Fatalf("counts %+v: a refused topic reached the listener, or was counted as a cut", c)
		}
		if got := m.WorkerCounts()[5].WrongTopic; got != 0 {
			t.Fatalf("worker 5 shows %d wrong topics: a cut connection is not the worker's", got)
		}
	})
	t.Run("any", func(t *testing.T) {
		r, m := eventRouter(t, true, WithBindPeers(PeersAny))
		topicWorkers(t, r)
		b, err := m.Bind("tcp://127.0.0.1:*", ResolverFor(r))
		if err != nil {
			t.Fatal(err)
		}
		heardFrom(t, m, b, "127.0.0.1", 5) // another host's publisher
		if got := m.stats.WrongTopic.Load(); got != 0 {
			t.Fatalf("wrong topic %d under PeersAny", got)
		}
	})
}

// TestBindGateClosesStrangers: with the catalog's hosts (WithWorkerHosts,
// as the gateway binds), a connection from an address that is no
// worker's host is closed before its handshake and counted, so strangers
// that greet and then say nothing cannot hold the places of
// kv_events_max_peers; a worker's own publisher is then heard, and a
// worker registered later is let in within about a second.
func TestBindGateClosesStrangers(t *testing.T) {
	r, m := eventRouter(t, true, WithMaxPeers(2))
	topicWorkers(t, r)
	b, err := m.Bind("tcp://127.0.0.1:*", ResolverFor(r), WithWorkerHosts(HostsFor(r)))
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(b.Endpoint(), "tcp://")
	dialFrom := func(src string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	for i := range 6 {
		c := dialFrom("127.0.0.3")
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := c.Read(make([]byte, 64)); err != io.EOF {
			t.Fatalf("stranger %d: read %d bytes, %v; want it closed before any greeting", i, n, err)
		}
	}
	if got, turned := m.stats.WrongTopic.Load(), m.stats.TurnedAway.Load(); got != 6 || turned != 0 {
		t.Fatalf("wrong topic %d, turned away %d; want 6 strangers closed, none turned away", got, turned)
	}
	heardFrom(t, m, b, "127.0.0.1", 6)
	// A worker registered on the strangers' address is let in.
	if _, err := r.Catalog().UpsertWorker(&selection.WorkerRequest{WorkerID: ptr(uint64(8)), ModelName: ptr("m"),
		Endpoint: ptr("127.0.0.3:8000"), BlockSize: ptr(uint32(lbs))}); err != nil {
		t.Fatal(err)
	}
	heardFrom(t, m, b, "127.0.0.3", 8)
}

// heardFrom has a publisher dialing b from src send worker id's first
// four blocks, under its topic, until the index holds them.
func heardFrom(t *testing.T, m *Manager, b *BindListener, src string, id uint64) {
	t.Helper()
	send := publisherFrom(t, b, src)
	topic, prompt := fmt.Sprintf("kv@%d@m", id), testPrompt(33)
	key := selection.PartitionKey{Model: "m", Group: "default"}
	seq := uint64(0)
	eventually(t, topic+" heard from "+src, func() bool {
		send(topic, seq, chunk(EncodingArray, -1, prompt, 0, 4))
		seq++
		return m.Index.Blocks(key, selection.Rank{WorkerID: id}) == 4
	})
}

// TestWorkerHostsKeepsAnswers: a worker's host name is looked up once
// for any number of dials while its answer is kept, a failed lookup too
// (a peer that dials again and again costs no more lookups), and once for
// peers that dial at the same time; an address is not looked up; IPv4
// answers match a peer's IPv4 address.
func TestWorkerHostsKeepsAnswers(t *testing.T) {
	endpoints := map[uint64]string{1: "w1.example:8000", 2: "nx.example:8000", 3: "10.0.0.3:8000"}
	w := newWorkerHosts(func(id uint64, model string) (ListenerConfig, bool) {
		ep, ok := endpoints[id]
		return ListenerConfig{WorkerEndpoint: ep}, ok && model == "m"
	}, nil)
	var lookups atomic.Int32
	w.lookup = func(_ context.Context, host string) ([]netip.Addr, error) {
		lookups.Add(1)
		time.Sleep(50 * time.Millisecond) // long enough for the peers below to meet in it
		if host == "w1.example" {
			return []netip.Addr{netip.MustParseAddr("::ffff:10.0.0.1")}, nil
		}
		return nil, errors.New("no such host")
	}
	peer := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if err := w.allow("kv@1@m", peer("10.0.0.1")); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got := lookups.Load(); got != 1 {
		t.Fatalf("%d lookups for 50 peers dialing at once, want 1", got)
	}
	for range 3 {
		if err := w.allow("kv@1@m", peer("10.0.0.1")); err != nil {
			t.Fatal(err)
		}
		if err := w.allow("kv@1@m", peer("10.0.0.2")); err == nil {
			t.Fatal("a peer on another address was let send for worker 1")
		}
		if err := w.allow("kv@2@m", peer("10.0.0.2")); err == nil || !strings.Contains(err.Error(), "no such host") {
			t.Fatalf("worker 2's host does not resolve: %v", err)
		}
		if err := w.allow("kv@3@m", peer("10.0.0.3")); err != nil {
			t.Fatal(err)
		}
		if err := w.allow("kv@3@x", peer("10.0.0.3")); err == nil {
			t.Fatal("a topic naming another model passed")
		}
	}
	if got := lookups.Load(); got != 2 {
		t.Fatalf("%d lookups, want 2 (one per name)", got)
	}
}

// TestBindHearsSGLangSnapshotTopics: SGLang serving snapshots sends
// every live message under its topic with "\x00sgl-kv-epoch=<id>" after
// it, and the empty batch marking a snapshot with "\x00sgl-kv-snapshot=<id>"
// after that. Bind mode read the worker's model as all of it and dropped
// every message, and a second suffix on one connection cut it. Under
// worker_host, one connection now carries both to worker 6's index; a
// part that is not SGLang's still cuts it.
func TestBindHearsSGLangSnapshotTopics(t *testing.T) {
	r, m := eventRouter(t, true)
	topicWorkers(t, r)
	b, err := m.Bind("tcp://127.0.0.1:*", ResolverFor(r))
	if err != nil {
		t.Fatal(err)
	}
	key := selection.PartitionKey{Model: "m", Group: "default"}
	blocks := func() int { return m.Index.Blocks(key, selection.Rank{WorkerID: 6}) }
	prompt := testPrompt(35)
	send := publisherFrom(t, b, "127.0.0.1")
	live := "kv@6@m\x00sgl-kv-epoch=5b0c1f3e9a8d4c2b"
	seq := uint64(0)
	eventually(t, "the live topic heard", func() bool {
		send(live, seq, chunk(EncodingArray, -1, prompt, 0, 4))
		seq++
		return blocks() == 4
	})
	send(live+"\x00sgl-kv-snapshot=77e1", seq, AppendBatch(nil, EncodingArray, 0, -1))
	seq++
	eventually(t, "the live topic after the snapshot's mark", func() bool {
		send(live, seq, chunk(EncodingArray, -1, prompt, 4, 8))
		seq++
		return blocks() == 8
	})
	if c := m.stats.Counts(); c.WrongTopic != 0 || c.Malformed != 0 {
		t.Fatalf("counts %+v: an SGLang topic was refused", c)
	}
	eventually(t, "a foreign part cut", func() bool {
		send("kv@6@m\x00other=1", seq, chunk(EncodingArray, -1, prompt, 8, 12))
		seq++
		return m.stats.WrongTopic.Load() > 0
	})
	if blocks() != 8 {
		t.Fatalf("worker 6 holds %d blocks: a cut message reached the index", blocks())
	}
}
