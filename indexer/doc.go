// Package indexer will hold the event-fed KV index: a prefix index keyed by
// our own block hashes, fed by the vLLM/SGLang KV events each worker
// publishes over ZMQ, with sequence tracking and replay. It implements
// selection.Indexer. Until it lands, routers run with use_kv_events off and
// use selection.ApproxIndex, which learns from bookings instead of events.
package indexer
