//go:build !race

package caddymodule

// cancelRequests is how many requests TestCancelsAtScale holds in flight
// at once.
const cancelRequests = 10000
