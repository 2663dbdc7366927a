package caddymodule

import "testing"

// TestModelLabelsPruneWhatCameAfter: a request that took a model's label
// before the prune that deleted the model counts its series after it,
// under a label the set no longer holds; the next prune deletes them too.
// A race of requests and prunes left 1,219 such series behind, and
// filled the prediction ledger.
func TestModelLabelsPruneWhatCameAfter(t *testing.T) {
	s := new(modelLabelSet)
	label := s.of("leaving-model")
	none := func(string) bool { return false }
	s.prune(none) // between the request's label and its counts
	requestsTotal.WithLabelValues(label, "routed", "kv").Inc()
	predictions.count(label, func(m *modelPredictions) { m.Requests++ })
	s.prune(none)
	if modelsLabelled(requestsTotal)[label] {
		t.Fatal("the late request's series outlived the next prune")
	}
	if _, ok := predictions.snapshot()[label]; ok {
		t.Fatal("the late request's prediction counts outlived the next prune")
	}
}
