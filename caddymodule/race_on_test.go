//go:build race

package caddymodule

// raceDetector is set in the race detector's build, whose slower runs let
// other goroutines' allocations into what a test measures.
const raceDetector = true
