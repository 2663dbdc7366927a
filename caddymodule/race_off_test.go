//go:build !race

package caddymodule

// raceDetector is set in the race detector's build (race_on_test.go).
const raceDetector = false
