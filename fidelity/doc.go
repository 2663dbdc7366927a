// Package fidelity tests the gateway in front of kvmock in its faithful
// mode: engines that tokenize, render chat templates, report usage and
// list adapters as vLLM does, including the parts that make a gateway's
// job harder (a BOS the chat template writes itself, tools rendered into
// every block, usage only when a stream asks for it). Both run as the
// binaries an operator runs (bin/caddy and bin/kvmock), on loopback ports
// the OS chose, and the tests check what the gateway predicted against
// what the engines reported.
package fidelity
