// Package hostile attacks the built gateway from the outside, as issue 10
// ("Safe to expose") asks: no single request, publisher or registration may
// crash, hijack or bloat it.
//
// `make hostile` (go test -count=1 -v -run Hostile ./hostile/) starts
// bin/caddy as a subprocess on loopback ports the OS chose, with in-test
// vLLM-like workers and real ZMQ publishers, and plays each attack of the
// issue against it: oversized and unauthenticated catalog writes, worker
// endpoints that point at the gateway itself, an endpoint swap under a
// cached session, a dead fleet and a worker that only answers 503,
// oversized ZMQ frames, an index flood and its /dump, unfreed reservations,
// lying sequence numbers and ranks, an unserved model and a worker that
// hangs before its headers. Each attack fails when the gateway's answer is
// not the expected one, when the process exits, when its RSS passes its
// bound or when its open file descriptors reach 1,024; the run prints a
// table of expected and observed answers with RSS and fds before and after
// (RELIABILITY.md, "Hostile inputs").
//
// The package holds tests only (this file gives it a doc and a non-test
// file). It drives a real process rather than the Go API so that what is
// measured is what an attacker reaches: the listeners, the process's memory
// and its descriptors.
package hostile
