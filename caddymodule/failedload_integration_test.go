package caddymodule

import (
	"fmt"
	"net"
	"net/http"
	"slices"
	"testing"
)

// loadExpectingFailure posts caddyfile to the admin API, which must
// refuse it.
func loadExpectingFailure(t *testing.T, caddyfile string) {
	t.Helper()
	if status, _ := postLoad(t, caddyfile); status == http.StatusOK {
		t.Fatalf("a load that should fail went through")
	}
}

// TestFailedLoadLeavesTheRunningRouter: a config that Caddy refuses, after
// the kv_router app started (its own start failing, or another app's),
// leaves the running config's workers and settings in the router. Both
// used to stay changed (an operator probe: workers 1-4 running, 1, 2, 3, 5
// routed; every registration a 409 "catalog is full" of the refused
// max_workers), and resending the good config, unchanged to Caddy, did not
// undo it.
func TestFailedLoadLeavesTheRunningRouter(t *testing.T) {
	tester := newTester(t)
	good := testCaddyfile(worker1 + "\n" + worker3)
	tester.InitServer(good, "caddyfile")
	running := pooledState(t).router.Config().MaxWorkers
	settled := func(when string) {
		t.Helper()
		if got := workerIDs(t, tester); !slices.Equal(got, []uint64{1, 3}) {
			t.Fatalf("%s: workers %v, want the running config's [1 3]", when, got)
		}
		if got := pooledState(t).router.Config().MaxWorkers; got != running {
			t.Fatalf("%s: max_workers %d, want the running config's %d", when, got, running)
		}
	}
	bad := func(tail string) string {
		return testCaddyfile(worker1+"\n"+`		worker 5 {
			endpoint 127.0.0.1:9005
			model_name m
		}
		max_workers 2
`+tail) + "\n"
	}
	// The kv_router app's own start fails: a cluster credentials file
	// that does not exist.
	loadExpectingFailure(t, bad("		cluster nats://127.0.0.1:9 {\n			credentials /nonexistent/kvrouter.creds\n		}\n"))
	settled("after a load whose kv_router start failed")

	// Another app fails to start: a second site on a port that is taken.
	// Caddy starts apps in no fixed order, so some tries fail before the
	// kv_router app starts and some after.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	site := fmt.Sprintf("\n:%d {\n\tbind 127.0.0.1\n\trespond \"x\"\n}\n", taken.Addr().(*net.TCPAddr).Port)
	for range 6 {
		loadExpectingFailure(t, bad("")+site)
		settled("after a load whose http app failed")
	}
	callJSON(t, tester, http.MethodPost, "/workers", worker2JSON, http.StatusCreated, nil)
}

// TestReloadRaisesABoundAndUsesIt: a reload's settings are applied before
// its workers, so it may raise max_workers and declare the workers the
// new bound allows; it used to take two reloads ("catalog is full" of the
// old bound, which the error named).
func TestReloadRaisesABoundAndUsesIt(t *testing.T) {
	tester := newTester(t)
	tester.InitServer(testCaddyfile(worker1+"\n		max_workers 1\n"), "caddyfile")
	reloadFor(t, tester, testCaddyfile(worker1+"\n"+worker3+"\n		max_workers 2\n"))
	if got := workerIDs(t, tester); !slices.Equal(got, []uint64{1, 3}) {
		t.Fatalf("workers %v, want [1 3]", got)
	}
}
