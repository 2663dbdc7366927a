package selection

import "testing"

// TestModelVersionFollowsItsModelsWorkers: a model's version moves with
// its own workers' changes only, is 0 once no worker names the model, and
// is new when the model comes back (a cache keyed by it must not take an
// old entry for the new workers).
func TestModelVersionFollowsItsModelsWorkers(t *testing.T) {
	r := newTestRouter(t, nil)
	c := r.Catalog()
	named := func(model string) func(*WorkerRequest) {
		return func(w *WorkerRequest) { w.ModelName = ptr(model) }
	}
	if v := c.ModelVersion("a"); v != 0 {
		t.Fatalf("a model no worker names: version %d, want 0", v)
	}
	addWorker(t, r, 1, named("a"))
	a1 := c.ModelVersion("a")
	if a1 == 0 {
		t.Fatal("a model with a worker has version 0")
	}
	addWorker(t, r, 2, named("b"))
	if got := c.ModelVersion("a"); got != a1 {
		t.Fatalf("another model's worker changed a's version: %d, was %d", got, a1)
	}
	b1 := c.ModelVersion("b")
	addWorker(t, r, 1, func(w *WorkerRequest) { w.ModelName = ptr("a"); w.MaxModelLen = ptr(uint64(4096)) })
	a2 := c.ModelVersion("a")
	if a2 == a1 || c.ModelVersion("b") != b1 {
		t.Fatalf("rewriting a's worker: a %d (was %d), b %d (was %d)", a2, a1, c.ModelVersion("b"), b1)
	}
	// A worker that moves from a to b changes both.
	addWorker(t, r, 1, named("b"))
	if c.ModelVersion("a") != 0 {
		t.Fatalf("no worker names a: version %d, want 0", c.ModelVersion("a"))
	}
	if c.ModelVersion("b") == b1 {
		t.Fatal("a worker joined b and b's version stayed")
	}
	addWorker(t, r, 3, named("a"))
	if a3 := c.ModelVersion("a"); a3 == 0 || a3 == a1 || a3 == a2 {
		t.Fatalf("a came back with version %d, one it had (%d, %d)", a3, a1, a2)
	}
	if _, err := c.DeleteWorker(3); err != nil {
		t.Fatal(err)
	}
	if c.ModelVersion("a") != 0 {
		t.Fatalf("a's last worker deleted: version %d, want 0", c.ModelVersion("a"))
	}
}
