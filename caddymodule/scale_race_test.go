//go:build race

package caddymodule

// cancelRequests is how many requests TestCancelsAtScale holds in flight
// at once. The race detector aborts a program with more than 8,128 live
// goroutines, and each request in flight takes about five here (the
// client's, Caddy's handler and upstream stream, the worker's handler), so
// the race run is smaller.
const cancelRequests = 1000
