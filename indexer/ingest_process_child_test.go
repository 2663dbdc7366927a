package indexer

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// fleetChildEnv, set to a count, makes this test binary the publishing
// fleet of BenchmarkIngestFleetProcess instead of running tests: the
// parent starts it with the variable set and drives it over stdin.
const fleetChildEnv = "INDEXER_FLEET_CHILD"

func init() {
	// In init, so that the fleet runs before the testing package parses
	// flags or TestMain checks for leaks: this process is not a test run.
	s := os.Getenv(fleetChildEnv)
	if s == "" {
		return
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		fmt.Fprintf(os.Stderr, "%s=%q\n", fleetChildEnv, s)
		os.Exit(2)
	}
	if err := runFleetChild(n, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fleet process:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runFleetChild binds n XPUB publishers on 127.0.0.1 and writes their
// endpoints, then "bound"; with fleetBindEnv set, it connects them to that
// endpoint instead, each publishing under its worker's topic
// (fleetWorkerID), and writes "bound" alone. Once every publisher has a
// subscriber it writes "ready". Then, line by line from in: "lap FROM N" has every
// publisher send payloads [FROM, FROM+N) of fleetSteadyPayloads; "cpu"
// waits for the lap's sends and writes "sent NS", the CPU this process
// used since the lap began. It returns at the end of in.
func runFleetChild(n int, in io.Reader, out io.Writer) error {
	zctx, err := zmq.NewContext()
	if err != nil {
		return err
	}
	defer func() { _ = zctx.Term() }()
	if err := zctx.SetMaxSockets(n + 16); err != nil {
		return err
	}
	socks := make([]*zmq.Socket, 0, n)
	defer func() {
		for _, s := range socks {
			s.Close()
		}
	}()
	w := bufio.NewWriter(out)
	gateway := os.Getenv(fleetBindEnv)
	topics := make([][]byte, n)
	for i := range n {
		s, err := zctx.NewSocket(zmq.XPUB)
		if err != nil {
			return err
		}
		socks = append(socks, s)
		_ = s.SetLinger(0)
		_ = s.SetSndhwm(0) // never drop: the parent measures throughput, not loss
		if gateway != "" {
			topics[i] = fmt.Appendf(nil, "kv@%d@m", fleetWorkerID(i))
			if err := s.Connect(gateway); err != nil {
				return err
			}
			continue
		}
		if err := s.Bind("tcp://127.0.0.1:*"); err != nil {
			return err
		}
		ep, _ := s.GetLastEndpoint()
		fmt.Fprintln(w, ep)
	}
	fmt.Fprintln(w, "bound")
	if err := w.Flush(); err != nil {
		return err
	}
	for i, s := range socks {
		_ = s.SetRcvtimeo(60 * time.Second)
		if _, err := s.RecvBytes(0); err != nil { // the listener's subscription
			return fmt.Errorf("publisher %d: no subscriber: %w", i, err)
		}
	}
	fmt.Fprintln(w, "ready")
	if err := w.Flush(); err != nil {
		return err
	}

	blocks, err := fleetBlocksFromEnv()
	if err != nil {
		return err
	}
	rate, err := fleetRateFromEnv()
	if err != nil {
		return err
	}
	// Each publisher's share of the rate, in payloads: one every interval.
	var interval time.Duration
	if rate > 0 {
		interval = time.Duration(float64(n*blocks) / rate * float64(time.Second))
	}
	payloads := make([]steady[[]byte], n)
	for i := range n {
		payloads[i] = fleetSteadyPayloads(uint64(i), blocks)
	}
	var (
		senders  sync.WaitGroup
		lapStart time.Duration
		sendErr  error
		errOnce  sync.Once
	)
	lines := bufio.NewScanner(in)
	for lines.Scan() {
		var from, count int
		switch line := lines.Text(); {
		case line == "cpu":
			senders.Wait()
			if sendErr != nil {
				return sendErr
			}
			fmt.Fprintf(w, "sent %d\n", (selfCPU() - lapStart).Nanoseconds())
			if err := w.Flush(); err != nil {
				return err
			}
		default:
			if _, err := fmt.Sscanf(line, "lap %d %d", &from, &count); err != nil {
				return fmt.Errorf("command %q: %w", line, err)
			}
			lapStart = selfCPU()
			for i, s := range socks {
				phase := interval * time.Duration(i) / time.Duration(n)
				senders.Go(func() {
					if err := sendPaced(s, topics[i], payloads[i], from, count, interval, phase); err != nil {
						errOnce.Do(func() { sendErr = err })
					}
				})
			}
		}
	}
	senders.Wait()
	return lines.Err()
}

// selfCPU is the CPU time every thread of this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
