package hostile

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// The gateway's resources as the kernel sees them. Go's own statistics
// would need the process's cooperation; /proc needs none and also counts
// what libzmq allocates outside the Go heap.

// procMem returns the process's resident set (VmRSS) and its peak since the
// last resetPeak (VmHWM), in bytes.
func procMem(pid int) (rss, hwm int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Bytes()
		for _, f := range []struct {
			name string
			dst  *int64
		}{{"VmRSS:", &rss}, {"VmHWM:", &hwm}} {
			if rest, ok := bytes.CutPrefix(line, []byte(f.name)); ok {
				kb, _ := strconv.ParseInt(string(bytes.TrimSpace(bytes.TrimSuffix(bytes.TrimSpace(rest), []byte("kB")))), 10, 64)
				*f.dst = kb << 10
			}
		}
	}
	if rss == 0 {
		return 0, 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return rss, hwm, nil
}

// fdCount counts the process's open file descriptors.
func fdCount(pid int) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents), err
}

// resetPeak sets VmHWM back to the current RSS (clear_refs "5"), so that
// the peak read after an attack is that attack's own: a sampler can miss a
// spike shorter than its period, the kernel's high-water mark cannot.
func resetPeak(pid int) bool {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0) == nil
}

// usage is a process's RSS (bytes) and fd count at one moment; ok is false
// once the process is gone.
type usage struct {
	rss int64
	fds int
	ok  bool
}

func usageOf(pid int) usage {
	rss, _, err := procMem(pid)
	if err != nil {
		return usage{}
	}
	fds, err := fdCount(pid)
	if err != nil {
		return usage{}
	}
	return usage{rss: rss, fds: fds, ok: true}
}

// sampler records the highest RSS and fd count of a process while an
// attack runs. The fd peak can only be sampled (the kernel keeps no
// high-water mark for it), so it samples often: a burst of listeners
// that reaches 1,024 fds lasts far longer than 20 ms.
type sampler struct {
	pid      int
	hwmReset bool
	stop     chan struct{}
	done     sync.WaitGroup
	peakRSS  int64
	peakFDs  int
}

func startSampler(pid int) *sampler {
	s := &sampler{pid: pid, stop: make(chan struct{})}
	s.hwmReset = resetPeak(pid)
	s.observe()
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
				s.observe()
			}
		}
	}()
	return s
}

func (s *sampler) observe() {
	u := usageOf(s.pid)
	if !u.ok {
		return
	}
	s.peakRSS = max(s.peakRSS, u.rss)
	s.peakFDs = max(s.peakFDs, u.fds)
}

// finish stops sampling and returns the peaks: the kernel's high-water mark
// when it could be reset at the start, else the highest sample.
func (s *sampler) finish() (peakRSS int64, peakFDs int) {
	close(s.stop)
	s.done.Wait()
	s.observe()
	if _, hwm, err := procMem(s.pid); err == nil && s.hwmReset {
		s.peakRSS = max(s.peakRSS, hwm)
	}
	return s.peakRSS, s.peakFDs
}
