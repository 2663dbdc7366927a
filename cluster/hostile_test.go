package cluster

import (
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"
)

// rawEnvelope is a hand-built envelope of the test replicas' settings
// (fingerprint 42, version "test"), with tail as the raw value of its
// events ("x").
func rawEnvelope(origin string, epoch uint64, tail []byte) []byte {
	b, _ := msgpack.Marshal(map[string]any{"o": origin, "f": uint64(42), "v": "test", "e": epoch})
	b[0]++ // a fixmap of one entry more: the events
	k, _ := msgpack.Marshal("x")
	return append(append(b, k...), tail...)
}

// hostilePeer is a NATS client holding the replicas' credentials.
func hostilePeer(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// publishEnvelope sends events as origin, in the test replicas' settings.
func publishEnvelope(t *testing.T, nc *nats.Conn, origin string, epoch uint64, events []event) {
	t.Helper()
	publish(t, nc, &envelope{Origin: origin, Fingerprint: 42, Version: "test", Epoch: epoch, Events: events})
}

// publish sends env on its origin's subject.
func publish(t *testing.T, nc *nats.Conn, env *envelope) {
	t.Helper()
	data, err := encode(env)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("kvrouter.r."+env.Origin, data); err != nil {
		t.Fatal(err)
	}
}

// TestMessagesClaimingMoreThanTheyHold: messages whose array headers
// claim more elements than they hold, or than the bounds, are dropped as
// malformed without the library allocating for the claim: a 47-byte
// message claiming 2^32 events used to ask for 721 GB and kill the
// process, one claiming 2^32 hashes for 34 GB, and 256 KiB of 262,000
// empty events made 88 MB of events before their count was checked.
func TestMessagesClaimingMoreThanTheyHold(t *testing.T) {
	s := natsServer(t, 0)
	rb := startReplica(t, testRouter(t), s.ClientURL(), "b", nil)
	nc := hostilePeer(t, s.ClientURL())
	reserveWithHashes, _ := msgpack.Marshal(map[string]any{"k": kindReserve, "i": "x"})
	reserveWithHashes[0]++ // one more entry: "h"
	h, _ := msgpack.Marshal("h")
	reserveWithHashes = append(append(reserveWithHashes, h...), 0xdd, 0xff, 0xff, 0xff, 0xff)
	n := 262_000
	empties := []byte{0xdd, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
	for range n {
		empties = append(empties, 0x80)
	}
	msgs := map[string][]byte{
		"2^32 events":             rawEnvelope("evil", 1, []byte{0xdd, 0xff, 0xff, 0xff, 0xff}),
		"2^32 hashes":             rawEnvelope("evil", 1, append([]byte{0x91}, reserveWithHashes...)),
		"262,000 empty events":    rawEnvelope("evil", 1, empties),
		"a string past the end":   rawEnvelope("evil", 1, []byte{0x91, 0x81, 0xa1, 'i', 0xdb, 0x7f, 0xff, 0xff, 0xff}),
		"bytes after the message": append(rawEnvelope("evil", 1, []byte{0x90}), 0xc0),
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, m := range msgs {
		if err := nc.Publish("kvrouter.r.evil", m); err != nil {
			t.Fatal(err)
		}
	}
	_ = nc.Flush()
	waitFor(t, 10*time.Second, "every message dropped as malformed", func() bool { return rb.Stats().Dropped["malformed"] >= uint64(len(msgs)) })
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
		t.Errorf("%d hostile messages (the largest %d bytes) made the replica allocate %d MiB", len(msgs), len(empties), grew>>20)
	}
}

// TestCheckShape: well-formed messages pass whole; every kind of claim
// past the message or the bound is refused.
func TestCheckShape(t *testing.T) {
	good, err := encode(&envelope{Origin: "a", Fingerprint: 1, Version: "v", Epoch: 7, Events: []event{
		{Kind: kindReserve, ID: "r", Model: "m", Hashes: []uint64{1, 1 << 40, 1 << 63}, Prefill: 300, Session: "s"},
		{Kind: kindHeartbeat, Digests: []digest{{Partition: "m:g", Entries: 9, Xor: 1 << 62}}},
		{Kind: kindOutput, ID: "r", Decay: new(float64)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := checkShape(good, 4096); err != nil {
		t.Fatalf("a well-formed message: %v", err)
	}
	for i := range good {
		if checkShape(good[:i], 4096) == nil {
			t.Errorf("a message cut at %d of %d bytes passed", i, len(good))
		}
	}
	if checkShape(good, 2) == nil {
		t.Error("an array of 3 hashes passed a bound of 2")
	}
	for name, b := range map[string][]byte{
		"array32 past the end": {0xdd, 0, 0, 0, 9, 1, 2},
		"map16 past the end":   {0xde, 0, 2, 1, 2, 3},
		"str32 past the end":   {0xdb, 0, 0, 1, 0, 'a'},
		"ext8 past the end":    {0xc7, 5, 1, 'a'},
		"the unused byte":      {0xc1},
		"nothing":              {},
	} {
		if checkShape(b, 4096) == nil {
			t.Errorf("%s passed", name)
		}
	}
}

// TestPeerNumbersAreBounded: a remote booking's prefill tokens and
// outputs are refused past maxRemoteTokens: 2^64 - 10,000 prefill tokens
// wrapped the rank's sum and erased this replica's own 10,000, and 2^62
// outputs rounded the rank's other decode blocks away for good.
func TestPeerNumbersAreBounded(t *testing.T) {
	s := natsServer(t, 0)
	b := testRouter(t)
	rb := startReplica(t, b, s.ClientURL(), "b", nil)
	reserve(t, b, "local", 1, []uint64{1, 2, 3}, 10000)
	nc := hostilePeer(t, s.ClientURL())
	publishEnvelope(t, nc, "evil", 1, []event{
		{Kind: kindReserve, ID: "x", Model: "default", Group: "default", Worker: 1, Prefill: math.MaxUint64 - 9999},
		{Kind: kindReserve, ID: "y", Model: "default", Group: "default", Worker: 1, Outputs: 1 << 62},
		{Kind: kindReserve, ID: "z", Model: "default", Group: "default", Worker: 1, Prefill: 500, Outputs: 2},
	})
	_ = nc.Flush()
	waitFor(t, 5*time.Second, "the honest booking applied", func() bool { return b.Remote().Total() == 1 })
	if got := rb.Stats().Dropped["bad_field"]; got != 2 {
		t.Errorf("%d bookings dropped as bad_field, want 2", got)
	}
	if l := load(b, 1); l.PotentialPrefillTokens != 10500 {
		t.Errorf("worker 1's prefill load is %d, want this replica's 10,000 and the peer's 500", l.PotentialPrefillTokens)
	}
}

// TestPeerIdentityChecks: a name no replica can have is dropped before it
// is followed (a name that is not UTF-8 became a metric label and failed
// every scrape), and an epoch far ahead of this replica's clock is not
// taken as the origin's newest (one message under a's name with epoch
// 2^64 - 1 dropped a's bookings and made its real messages stale).
func TestPeerIdentityChecks(t *testing.T) {
	s := natsServer(t, 0)
	a, b := testRouter(t), testRouter(t)
	_, rb := joinedPair(t, a, b, s.ClientURL(), nil)
	nc := hostilePeer(t, s.ClientURL())
	publishEnvelope(t, nc, "x\xff\xfe", 1, []event{{Kind: kindHeartbeat}})
	reserve(t, a, "a1", 1, []uint64{1, 2, 3}, 40)
	waitFor(t, 5*time.Second, "a's booking on b", func() bool { return load(b, 1).ActiveRequests == 1 })
	publishEnvelope(t, nc, "a", math.MaxUint64, []event{{Kind: kindHeartbeat}})
	_ = nc.Flush()
	waitFor(t, 5*time.Second, "the forged epoch dropped", func() bool { return rb.Stats().Dropped["future_epoch"] == 1 })
	reserve(t, a, "a2", 1, []uint64{4, 5, 6}, 40)
	waitFor(t, 5*time.Second, "a's next booking on b", func() bool { return load(b, 1).ActiveRequests == 2 })
	st := rb.Stats()
	if st.Dropped["malformed"] != 1 || st.Peers != 1 {
		t.Errorf("the bad name: malformed %d, peers %d; want 1 and 1 (a alone)", st.Dropped["malformed"], st.Peers)
	}
	for name := range st.DigestDiff {
		if checkToken("name", name) != nil {
			t.Errorf("a peer followed under the name %q", name)
		}
	}
}

// TestHelloFloodIsCoalesced: hellos make a replica announce its bookings
// at most once a heartbeat, however many come (a second of hellos made a
// replica with 2,000 bookings announce 73 times, 17,000 times the bytes
// that asked).
func TestHelloFloodIsCoalesced(t *testing.T) {
	s := natsServer(t, 0)
	a, b := testRouter(t), testRouter(t)
	slow := func(c *Config) { c.Heartbeat, c.Lease = 500*time.Millisecond, 3*time.Second }
	ra, _ := joinedPair(t, a, b, s.ClientURL(), slow)
	for i := range 200 {
		reserve(t, a, fmt.Sprintf("a%d", i), uint64(1+i%2), []uint64{uint64(3*i + 1), uint64(3*i + 2), uint64(3*i + 3)}, 100)
	}
	waitFor(t, 10*time.Second, "b holds a's bookings", func() bool { return b.Remote().Total() == 200 })
	nc := hostilePeer(t, s.ClientURL())
	before := ra.Stats().Announcements
	start := time.Now()
	for time.Since(start) < 2*time.Second {
		publishEnvelope(t, nc, "evil", uint64(time.Now().UnixNano()), []event{{Kind: kindHello}})
		time.Sleep(time.Millisecond)
	}
	_ = nc.Flush()
	time.Sleep(200 * time.Millisecond)
	// Two seconds at a heartbeat of half a second: four or five, not
	// hundreds.
	if n := ra.Stats().Announcements - before; n > 6 {
		t.Errorf("two seconds of hellos made a announce %d times", n)
	}
	waitFor(t, 10*time.Second, "b still holds a's bookings", func() bool { return b.Remote().Total() == 200 })
}

// TestSlowConsumerIsCountedAndRepaired: when NATS drops messages of this
// replica's subscription (its pending bound passed), the loss is counted
// and a hello asks the others to announce, which repairs what was lost;
// before, nothing counted it and nothing asked (lost frees left phantom
// load until some announcement happened to come).
func TestSlowConsumerIsCountedAndRepaired(t *testing.T) {
	s := natsServer(t, 0)
	a, b := testRouter(t), testRouter(t)
	ra, rb := joinedPair(t, a, b, s.ClientURL(), nil)
	before := ra.Stats().Announcements
	rb.asyncError(nats.ErrSlowConsumer)
	waitFor(t, 5*time.Second, "a announces again", func() bool { return ra.Stats().Announcements > before })
	if got := rb.Stats().Dropped["slow_consumer"]; got != 1 {
		t.Errorf("slow_consumer counted %d times, want 1", got)
	}
}

// TestDigestFloodWalksTheIndexOnce: messages carrying index digests are
// compared against one walk of this replica's index a heartbeat, however
// many come (each walked the index before: 200 of them held the
// subscription for 6 s on a 100k-entry index).
func TestDigestFloodWalksTheIndexOnce(t *testing.T) {
	s := natsServer(t, 0)
	b := testRouter(t)
	rb := startReplica(t, b, s.ClientURL(), "b", func(c *Config) { c.Heartbeat, c.Lease = time.Minute, 3*time.Minute })
	nc := hostilePeer(t, s.ClientURL())
	for range 200 {
		publishEnvelope(t, nc, "peer", 1, []event{{Kind: kindHeartbeat, Digests: []digest{{Partition: "default:default", Entries: 1}}}})
	}
	_ = nc.Flush()
	waitFor(t, 10*time.Second, "b reads the 200 messages", func() bool { return rb.Stats().RecvMessages >= 200 })
	rb.digestMu.Lock()
	walks := rb.digestWalks
	rb.digestMu.Unlock()
	if walks != 1 {
		t.Errorf("200 digest messages within a heartbeat walked the index %d times, want 1", walks)
	}
}

// TestRemoteBlocksAreBounded: the prompt blocks one peer's bookings hold
// here are bounded (max_remote_blocks), not only their number: 65,536
// bookings of 4,096 blocks each held 2 GiB a peer. A booking past the
// bound is dropped and counted; one freed makes room again.
func TestRemoteBlocksAreBounded(t *testing.T) {
	s := natsServer(t, 0)
	b := testRouter(t)
	rb := startReplica(t, b, s.ClientURL(), "b", func(c *Config) { c.MaxRemoteBlocks = 100 })
	nc := hostilePeer(t, s.ClientURL())
	forty := func(first uint64) []uint64 {
		h := make([]uint64, 40)
		for i := range h {
			h[i] = first + uint64(i)
		}
		return h
	}
	booking := func(id string, first uint64) event {
		return event{Kind: kindReserve, ID: id, Model: "default", Group: "default", Worker: 1, Hashes: forty(first)}
	}
	publishEnvelope(t, nc, "peer", 1, []event{booking("x", 1), booking("y", 100), booking("z", 200)})
	_ = nc.Flush()
	waitFor(t, 5*time.Second, "the third booking dropped", func() bool { return rb.Stats().Dropped["over_bound"] == 1 })
	if n := b.Remote().Count("peer"); n != 2 {
		t.Fatalf("%d of the peer's bookings held, want 2 (80 of 100 blocks)", n)
	}
	read := rb.Stats().RecvMessages
	publishEnvelope(t, nc, "peer", 1, []event{{Kind: kindFree, ID: "x"}, booking("z", 200)})
	_ = nc.Flush()
	waitFor(t, 5*time.Second, "the free and the booking read", func() bool { return rb.Stats().RecvMessages > read })
	if n, over := b.Remote().Count("peer"), rb.Stats().Dropped["over_bound"]; n != 2 || over != 1 {
		t.Errorf("after a free: %d bookings held, %d dropped; want 2 and still 1", n, over)
	}
}

// TestForgedFutureEpochHoldsForALeaseAtMost: one message under a real
// replica's name with an epoch almost an hour ahead (within what clock
// skew allows) and the longest lease made the real replica's messages
// stale: its bookings were dropped and its next ones ignored for the
// forged lease, ten minutes. The forged epoch now holds until it has been
// silent for a lease (the receiver's, when shorter); then the real
// replica is followed again and asked for its bookings.
func TestForgedFutureEpochHoldsForALeaseAtMost(t *testing.T) {
	s := natsServer(t, 0)
	a, b := testRouter(t), testRouter(t)
	_, rb := joinedPair(t, a, b, s.ClientURL(), nil) // lease 300ms
	reserve(t, a, "a1", 1, []uint64{1, 2}, 40)
	waitFor(t, 5*time.Second, "b holds a's booking", func() bool { return b.Remote().Count("a") == 1 })
	forged := uint64(time.Now().Add(59 * time.Minute).UnixNano())
	nc := hostilePeer(t, s.ClientURL())
	publish(t, nc, &envelope{Origin: "a", Fingerprint: 42, Version: "test", Epoch: forged,
		LeaseMs: uint64(maxPeerLease / time.Millisecond), Events: []event{{Kind: kindHeartbeat}}})
	_ = nc.Flush()
	waitFor(t, 5*time.Second, "the forged epoch drops a's booking", func() bool { return b.Remote().Count("a") == 0 })
	reserve(t, a, "a2", 2, []uint64{3, 4}, 40)
	took := waitFor(t, 5*time.Second, "b follows the real a again, both its bookings", func() bool { return b.Remote().Count("a") == 2 })
	t.Logf("a followed again %v after its booking", took)
	if n := rb.Stats().EpochsReverted; n != 1 {
		t.Fatalf("%d epochs reverted, want 1", n)
	}
}
