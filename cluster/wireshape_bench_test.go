package cluster

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// BenchmarkDecodeMessage: what checking a message's shape adds to
// decoding it, on the two messages the replicas send most: one booking of
// 1,024 blocks, and a batch of 64 lifecycle events (prefill complete,
// output, free). "msgpack" is the decode alone, the baseline; "checked"
// is decode, which walks the shape first.
func BenchmarkDecodeMessage(b *testing.B) {
	hashes := make([]uint64, 1024)
	for i := range hashes {
		hashes[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	lifecycle := make([]event, 64)
	for i := range lifecycle {
		lifecycle[i] = event{Kind: kindPrefill + uint8(i%3), ID: "conv-1234/turn-5678"}
	}
	for name, events := range map[string][]event{
		"booking":   {{Kind: kindReserve, ID: "conv-1234/turn-5678", Model: "m", Group: "default", Worker: 7, Hashes: hashes, Prefill: 16384}},
		"lifecycle": lifecycle,
	} {
		data, err := encode(&envelope{Origin: "a", Fingerprint: 1, Version: "v", Epoch: 1, Events: events})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name+"/msgpack", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				var env envelope
				if err := msgpack.Unmarshal(data, &env); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/checked", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				var env envelope
				if err := decode(data, &env, 4096); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
