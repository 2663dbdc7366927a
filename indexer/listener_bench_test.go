package indexer

import (
	"encoding/binary"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// BenchmarkEndToEndZMQ publishes vLLM-framed payloads of 16 BlockStored
// blocks (plus the removal of older ones) over a real tcp PUB socket to a
// Listener and waits until the index has applied them all; it reports
// blocks per second through the whole path, and the process's CPU per
// block (the publisher's share, the same in both, included). "native" is
// the listener as it runs, reading the publisher itself; "libzmq"
// receives through a libzmq SUB, the baseline.
func BenchmarkEndToEndZMQ(b *testing.B) {
	for _, c := range []struct {
		name      string
		viaLibzmq bool
	}{{"native", false}, {"libzmq", true}} {
		b.Run(c.name, func(b *testing.B) { benchEndToEnd(b, c.viaLibzmq) })
	}
}

func benchEndToEnd(b *testing.B, viaLibzmq bool) {
	zctx, err := zmq.NewContext()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = zctx.Term() }()
	pub, _ := zctx.NewSocket(zmq.XPUB)
	_ = pub.SetLinger(0)
	_ = pub.SetSndhwm(0) // never drop: this measures throughput, not loss
	if err := pub.Bind("tcp://127.0.0.1:*"); err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	ep, _ := pub.GetLastEndpoint()
	x := New()
	x.ConfigurePartition(part, 16, false)
	var stats Stats
	l, err := StartListener(zctx, x, &stats, nil, ListenerConfig{Endpoint: ep, Partition: part, Rank: selection.Rank{WorkerID: 1}, viaLibzmq: viaLibzmq})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Stop()
	_ = pub.SetRcvtimeo(5 * time.Second)
	if _, err := pub.RecvBytes(0); err != nil {
		b.Fatal("no subscription")
	}
	cpu0 := selfCPU()
	seq := publishSteady(b, pub, nil, &stats)
	cpu := selfCPU() - cpu0
	b.ReportMetric(float64(seq*blocksPer)/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(seq*blocksPer), "cpu-ns/block")
}

// BenchmarkEndToEndBind is BenchmarkEndToEndZMQ in bind mode: the PUB
// dials the gateway's bound endpoint. "gated" is what the gateway does by
// default: the frame gate accepts the publisher, and its connection is
// read natively (bindpeer.go) with its topics checked (topicguard.go);
// "gated_any_topic" the same without the check (kv_events_bind_peers
// any); "relayed" the gate in front of a libzmq SUB, as bind mode was
// before it read its publishers itself; "ungated" a libzmq SUB bound
// where the publisher dials. cpu-ns/block is the whole process's CPU
// (the publisher's included, the same in all).
func BenchmarkEndToEndBind(b *testing.B) {
	for _, c := range []struct {
		name string
		opts []ManagerOption
	}{
		{"gated", nil},
		{"gated_any_topic", []ManagerOption{WithBindPeers(PeersAny)}},
		{"relayed", []ManagerOption{func(l *limits) { l.relayed = true }}},
		{"ungated", []ManagerOption{func(l *limits) { l.ungated = true }}},
	} {
		b.Run(c.name, func(b *testing.B) { benchBind(b, c.opts) })
	}
}

func benchBind(b *testing.B, opts []ManagerOption) {
	zctx, err := zmq.NewContext()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = zctx.Term() }()
	x := New()
	x.ConfigurePartition(part, 16, false)
	var stats Stats
	resolve := func(uint64, string) (ListenerConfig, bool) {
		return ListenerConfig{Partition: part, Rank: selection.Rank{WorkerID: 1}, WorkerEndpoint: "127.0.0.1:8000"}, true
	}
	bl, err := StartBindListener(zctx, x, &stats, nil, "tcp://127.0.0.1:*", resolve, opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer bl.Stop()
	pub, _ := zctx.NewSocket(zmq.XPUB)
	_ = pub.SetLinger(0)
	_ = pub.SetSndhwm(0) // never drop: this measures throughput, not loss
	if err := pub.Connect(bl.Endpoint()); err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	_ = pub.SetRcvtimeo(5 * time.Second)
	if _, err := pub.RecvBytes(0); err != nil {
		b.Fatal("no subscription")
	}
	cpu0 := selfCPU()
	seq := publishSteady(b, pub, []byte("kv@1@m"), &stats)
	cpu := selfCPU() - cpu0
	b.ReportMetric(float64(seq*blocksPer)/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(seq*blocksPer), "cpu-ns/block")
}

// publishSteady sends b.N steady payloads under topic, numbered from 0,
// and waits until stats counts them all applied, timing just that; it
// returns how many it sent.
func publishSteady(b *testing.B, pub *zmq.Socket, topic []byte, stats *Stats) uint64 {
	payloads := steadyPayloads(EncodingMap, 5, 6)
	var seq uint64
	var s [8]byte
	b.ResetTimer()
	for b.Loop() {
		binary.BigEndian.PutUint64(s[:], seq)
		if _, err := pub.SendMessage(topic, s[:], payloads.at(int(seq))); err != nil {
			b.Fatal(err)
		}
		seq++
	}
	for stats.Batches.Load() < seq {
		time.Sleep(100 * time.Microsecond)
	}
	b.StopTimer()
	if c := stats.Counts(); c.Gaps != 0 || c.Malformed != 0 || c.Cut != 0 || c.WrongTopic != 0 {
		b.Fatalf("gaps %d malformed %d cut %d wrong topic %d", c.Gaps, c.Malformed, c.Cut, c.WrongTopic)
	}
	return seq
}
