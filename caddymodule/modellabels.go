package caddymodule

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// The model label. Its values are the catalog's models, which clients do
// not choose (an unknown model is counted under ""), but whoever writes
// the catalog does (the write token, a replica through the catalog
// bucket, an engine's own model name through engine facts), and models
// come and go: a thousand models registered, used once and deleted left
// 128,000 series behind (a 10 MB, 164 ms scrape). So a model's series go
// when no worker names it any more (pruned at each scrape), and at most
// maxModelLabels models are labelled apart at once; more are counted
// under otherModels until some leave.

// maxModelLabels bounds the models labelled apart at once.
const maxModelLabels = 256

// modelVec is a metric vector with a "model" label.
type modelVec interface {
	DeletePartialMatch(prometheus.Labels) int
}

// modelVecs are every vector with a model label; a model's series are
// deleted from each when it leaves.
func modelVecs() []modelVec {
	return []modelVec{requestsTotal, selectionSeconds, promptTokensTotal, cachedTokensTotal, ttftSeconds,
		usageReportsTotal, promptTokensMismatch, predictedCachedTotal, reportedCachedTotal, cachedPredictionError,
		predictionAccuracy, contextFiltered, queueDepth, queueWaitSeconds, queueAdmittedTotal, queueShedTotal, workerBusyTotal}
}

// modelLabelSet is the models labelled apart. Reads are a sync.Map load,
// on every request; adding and pruning take mu.
type modelLabelSet struct {
	labelled sync.Map // model → struct{}
	mu       sync.Mutex
	n        int
	// gone are the models the last prune deleted: a request that took a
	// model's label before the prune counts its series again after it,
	// under no label the set holds, so the next prune deletes them again
	// (a race test left 1,219 such series and a full prediction ledger).
	gone map[string]bool
}

var modelLabels = new(modelLabelSet)

// of is model's label value: the model itself, or otherModels when
// maxModelLabels others are labelled. "" (a model no worker serves) is
// always its own.
func (s *modelLabelSet) of(model string) string {
	if model == "" {
		return ""
	}
	if _, ok := s.labelled.Load(model); ok {
		return model
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.labelled.Load(model); ok {
		return model
	}
	if s.n >= maxModelLabels {
		return otherModels
	}
	s.labelled.Store(model, struct{}{})
	s.n++
	return model
}

// prune deletes the series, and the prediction counts, of every labelled
// model served reports false for, and frees its place; and those of
// otherModels once there is room.
func (s *modelLabelSet) prune(served func(model string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for model := range s.gone {
		if _, labelled := s.labelled.Load(model); !labelled && !served(model) {
			deleteModel(model)
		}
	}
	s.gone = map[string]bool{}
	s.labelled.Range(func(k, _ any) bool {
		model := k.(string)
		if served(model) {
			return true
		}
		s.labelled.Delete(model)
		s.n--
		deleteModel(model)
		s.gone[model] = true
		return true
	})
	if s.n < maxModelLabels {
		// There is room again: models counted together until now get
		// labels of their own, and the shared series would only grow
		// stale.
		deleteModel(otherModels)
	}
}

// deleteModel deletes model's series and prediction counts.
func deleteModel(model string) {
	for _, v := range modelVecs() {
		v.DeletePartialMatch(prometheus.Labels{"model": model})
	}
	predictions.forget(model)
}

// modelLabelPruner prunes the model labels at each scrape, before or
// beside the vectors' own collection: a model gone since the last scrape
// is not in this one, or is in it for the last time.
type modelLabelPruner struct{}

// Describe describes nothing: the pruner exports no metric.
func (modelLabelPruner) Describe(chan<- *prometheus.Desc) {}

func (modelLabelPruner) Collect(chan<- prometheus.Metric) {
	state := runningState()
	if state == nil {
		return
	}
	modelLabels.prune(state.router.Catalog().ServesModel)
}
