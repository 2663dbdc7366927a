package cluster

import (
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
	data, err := encode(&envelope{Origin: origin, Fingerprint: 42, Version: "test", Epoch: epoch, Events: events})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("kvrouter.r."+origin, data); err != nil {
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
