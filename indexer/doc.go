// Package indexer is the KV-event side of the gateway: it follows the KV
// events each worker rank publishes over ZMQ (vLLM's and SGLang's format,
// docs/kv-events.md), with sequence tracking and replay of gaps, and keeps
// the precise prefix index they feed, which implements selection.Indexer.
//
// The parts, by file:
//   - manager.go: Manager keeps one listener per worker rank in step with
//     the catalog (it is the router's catalog hook); bind.go is the
//     alternative, one bound socket that every publisher dials, behind a
//     frame gate (framegate.go) that bounds each message's frames as they
//     pass (zmtpscan.go).
//   - listener.go: framing, sequence tracking and replay of one publisher;
//     readwait.go parks it on Go's poller, ingestgate.go bounds how many
//     apply at once; internal/zmqframes receives its messages.
//   - decode.go, fields.go, msgpack.go: the payload decoder (token ids in
//     AVX-512 where the processor has it: idvbmi_amd64.go); event.go the
//     decoded events; encode.go an encoder for simulated publishers.
//   - index.go, tree.go, store.go, lookup.go, evict.go, memory.go, dump.go:
//     the index, its stores and removals, its lookups, its bound and dumps;
//     record.go its blocks and holders, slab.go the pages they live in,
//     reftable.go the hash tables from chain keys and engine hashes to them.
//   - stats.go, figures.go: the counters, Manager.Stats, and Figures,
//     the one table that the admin route and the metrics render.
//
// Routers that run with use_kv_events off use selection.ApproxIndex
// instead, which learns from bookings rather than events.
package indexer
