package caddymodule

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Helpers for the soak and cancel tests: they compare goroutines and open
// file descriptors of this test process (which holds the clients, Caddy
// and the workers alike) against a baseline.

// openFDs counts this process's open file descriptors (the directory
// read's own descriptor included, the same way every time).
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd here: %v", err)
	}
	return len(ents)
}

// processCounts is a goroutine and descriptor count at one moment.
type processCounts struct {
	goroutines, fds int
}

func (c processCounts) String() string {
	return fmt.Sprintf("%d goroutines, %d fds", c.goroutines, c.fds)
}

func countNow(t *testing.T) processCounts {
	t.Helper()
	return processCounts{runtime.NumGoroutine(), openFDs(t)}
}

// settledCounts waits until the counts stop moving (the same for a few
// polls in a row) and returns them. Closed connections, finished handlers
// and servers a reload replaced take a moment to go; the test then
// compares what is left with its baseline.
func settledCounts(t *testing.T) processCounts {
	t.Helper()
	prev, same := countNow(t), 0
	for deadline := time.Now().Add(5 * time.Second); same < 5 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		cur := countNow(t)
		if cur == prev {
			same++
		} else {
			same = 0
		}
		prev = cur
	}
	return prev
}

// backToBaseline waits (up to 15 s: Caddy's grace period and the idle
// connection timeouts must pass) until goroutines and descriptors are at
// most slack above base, and fails with a goroutine dump otherwise. It
// returns the last counts.
func backToBaseline(t *testing.T, base processCounts, slack int) processCounts {
	t.Helper()
	var cur processCounts
	for deadline := time.Now().Add(15 * time.Second); ; {
		cur = countNow(t)
		if cur.goroutines <= base.goroutines+slack && cur.fds <= base.fds+slack {
			return cur
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("not back to the baseline: %v now, %v before (slack %d)\n%s", cur, base, slack, buf)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// listeningSockets counts the TCP sockets of this process that listen on
// port: the gateway must hold exactly one for its site, whatever the
// number of reloads.
func listeningSockets(t *testing.T, port int) int {
	t.Helper()
	inodes := map[string]bool{}
	for _, file := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		f, err := os.Open(file)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "0A" { // 0A: LISTEN
				continue
			}
			_, hexPort, ok := strings.Cut(fields[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); ok && err == nil && int(p) == port {
				inodes[fields[9]] = true
			}
		}
		f.Close()
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd here: %v", err)
	}
	n := 0
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err == nil && strings.HasPrefix(target, "socket:[") && inodes[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")] {
			n++
		}
	}
	return n
}

// checkIdleLoads fails unless every rank of model m is back to no load: no
// request, prefill token or decode block left booked. A reservation freed
// twice would show here as a count that wrapped below zero.
func checkIdleLoads(t *testing.T, r *selection.Router) {
	t.Helper()
	for _, m := range r.Queries().Loads("m", "") {
		for _, l := range m.Loads {
			if l.ActiveRequests != 0 || l.PotentialPrefillTokens != 0 || l.PotentialDecodeBlocks != 0 {
				t.Errorf("worker %d/%d still loaded: %+v", l.WorkerID, l.DPRank, l)
			}
		}
	}
}
