package selection

import (
	"slices"
	"testing"
)

// TestEndpointsVersionFollowsWhatIsServed: the version moves when a
// schedulable worker's endpoint comes, goes or changes, and not on a
// write that leaves them (a worker's context, its taints).
func TestEndpointsVersionFollowsWhatIsServed(t *testing.T) {
	r := newTestRouter(t, nil)
	c := r.Catalog()
	step := func(what string, moved bool, write func()) {
		t.Helper()
		v := c.EndpointsVersion()
		write()
		if got := c.EndpointsVersion() != v; got != moved {
			t.Errorf("%s: version moved %v, want %v", what, got, moved)
		}
	}
	step("a worker joins", true, func() { addWorker(t, r, 1, nil) })
	step("its context is written", false, func() {
		if _, err := c.PatchWorker(1, &WorkerRequest{MaxModelLen: ptr(uint64(4096))}); err != nil {
			t.Fatal(err)
		}
	})
	step("its taints are written", false, func() { addWorker(t, r, 1, func(w *WorkerRequest) { w.Taints = []string{"x"} }) })
	step("its endpoint changes", true, func() { addWorker(t, r, 1, func(w *WorkerRequest) { w.Endpoint = ptr("127.0.0.1:10") }) })
	step("an incomplete worker joins", false, func() {
		if _, err := c.UpsertWorker(&WorkerRequest{WorkerID: ptr(uint64(2))}); err != nil {
			t.Fatal(err)
		}
	})
	step("a second worker joins", true, func() { addWorker(t, r, 3, func(w *WorkerRequest) { w.Endpoint = ptr("127.0.0.1:11") }) })
	if got := c.SchedulableEndpoints(nil); !slices.Equal(got, []string{"127.0.0.1:10", "127.0.0.1:11"}) {
		t.Errorf("served %v, want worker 1's and worker 3's", got)
	}
	step("a worker is deleted", true, func() {
		if _, err := c.DeleteWorker(1); err != nil {
			t.Fatal(err)
		}
	})
	if got := c.SchedulableEndpoints(nil); !slices.Equal(got, []string{"127.0.0.1:11"}) {
		t.Errorf("served %v after the delete, want worker 3's", got)
	}
}
