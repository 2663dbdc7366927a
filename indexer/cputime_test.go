package indexer

import (
	"runtime"
	"syscall"
	"testing"
	"time"
)

// threadCPU is the CPU time the calling OS thread has used. Benchmarks
// lock their goroutine to its thread and report CPU time per unit beside
// wall time: on a machine other jobs share, wall time measures them too.
func threadCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	const rusageThread = 1 // RUSAGE_THREAD (Linux)
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuMeter measures the CPU time of a benchmark's loop on its own thread.
type cpuMeter struct {
	tb    testing.TB
	start time.Duration
}

// startCPU locks the goroutine to its thread and starts counting.
func startCPU(tb testing.TB) *cpuMeter {
	runtime.LockOSThread()
	tb.Cleanup(runtime.UnlockOSThread)
	return &cpuMeter{tb: tb, start: threadCPU(tb)}
}

// per returns the CPU nanoseconds used since startCPU, per unit of n.
func (c *cpuMeter) per(n int) float64 {
	return float64((threadCPU(c.tb) - c.start).Nanoseconds()) / float64(n)
}
