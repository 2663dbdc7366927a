package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// The gateway's prediction accuracy during a run: the kv_router handler
// compares, for each answer with usage, the cached tokens it predicted
// with those the engine reported, and counts them per model in the
// "predictions" section of Caddy's admin /kv_router/stats. The counts are
// cumulative over the gateway's life, so a run's share is the difference
// between a reading before it and one after it; with --compare, the
// policies run one after the other, so each gets its own difference (the
// baselines do not go through the kv_router handler and add nothing).

// modelPredictions are one model's counts, as the gateway writes them.
type modelPredictions struct {
	Requests              int64 `json:"requests"`
	NoUsage               int64 `json:"no_usage"`
	NoCachedTokens        int64 `json:"no_cached_tokens"`
	PromptTokensMismatch  int64 `json:"prompt_tokens_mismatch"`
	CachedExact           int64 `json:"cached_exact"`
	CachedMore            int64 `json:"cached_more"`
	CachedLess            int64 `json:"cached_less"`
	PredictedCachedTokens int64 `json:"predicted_cached_tokens"`
	ReportedCachedTokens  int64 `json:"reported_cached_tokens"`
}

// minus is the counts added since old.
func (p modelPredictions) minus(old modelPredictions) modelPredictions {
	return modelPredictions{
		Requests:              p.Requests - old.Requests,
		NoUsage:               p.NoUsage - old.NoUsage,
		NoCachedTokens:        p.NoCachedTokens - old.NoCachedTokens,
		PromptTokensMismatch:  p.PromptTokensMismatch - old.PromptTokensMismatch,
		CachedExact:           p.CachedExact - old.CachedExact,
		CachedMore:            p.CachedMore - old.CachedMore,
		CachedLess:            p.CachedLess - old.CachedLess,
		PredictedCachedTokens: p.PredictedCachedTokens - old.PredictedCachedTokens,
		ReportedCachedTokens:  p.ReportedCachedTokens - old.ReportedCachedTokens,
	}
}

// add sums o into p.
func (p *modelPredictions) add(o modelPredictions) {
	p.Requests += o.Requests
	p.NoUsage += o.NoUsage
	p.NoCachedTokens += o.NoCachedTokens
	p.PromptTokensMismatch += o.PromptTokensMismatch
	p.CachedExact += o.CachedExact
	p.CachedMore += o.CachedMore
	p.CachedLess += o.CachedLess
	p.PredictedCachedTokens += o.PredictedCachedTokens
	p.ReportedCachedTokens += o.ReportedCachedTokens
}

// predictionReport is a run's predictions over all models.
type predictionReport struct {
	modelPredictions
	// Accuracy is CachedExact over the answers that reported cached
	// tokens, as the gateway computes it.
	Accuracy float64 `json:"accuracy"`
}

// readPredictions reads the predictions section of /kv_router/stats at
// url, summed over models. ok is false when the gateway answered but has
// no such section.
func readPredictions(client *http.Client, url string) (sum modelPredictions, ok bool, err error) {
	res, err := client.Get(url)
	if err != nil {
		return sum, false, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return sum, false, err
	}
	if res.StatusCode != http.StatusOK {
		return sum, false, fmt.Errorf("%s: status %d", url, res.StatusCode)
	}
	var stats struct {
		Predictions map[string]modelPredictions `json:"predictions"`
	}
	if err := json.Unmarshal(body, &stats); err != nil {
		return sum, false, fmt.Errorf("%s: %v", url, err)
	}
	if stats.Predictions == nil {
		return sum, false, nil
	}
	for _, m := range stats.Predictions {
		sum.add(m)
	}
	return sum, true, nil
}

// The gateway counts an answer as its handler returns, a little after
// the client has read the end of the stream, so stop reads until two
// readings settleStep apart agree, for at most settleMax.
const (
	settleStep = 250 * time.Millisecond
	settleMax  = 3 * time.Second
)

// predictionWatch reads the predictions before and after each run.
type predictionWatch struct {
	url    string
	client *http.Client
	before modelPredictions
	// state is why there is nothing to report, "" when there is.
	state string
}

// newPredictionWatch returns a watch of url, or nil for "".
func newPredictionWatch(url string) *predictionWatch {
	if url == "" {
		return nil
	}
	return &predictionWatch{url: url, client: &http.Client{Timeout: 10 * time.Second}}
}

// start reads the counts before a run.
func (w *predictionWatch) start() {
	if w == nil {
		return
	}
	p, ok, err := readPredictions(w.client, w.url)
	w.before, w.state = p, unavailable(ok, err)
}

// stop reads the counts after a run and returns what the run added, or
// nil when the gateway has none to give.
func (w *predictionWatch) stop() *predictionReport {
	if w == nil || w.state != "" {
		return nil
	}
	var after modelPredictions
	for deadline := time.Now().Add(settleMax); ; {
		time.Sleep(settleStep)
		p, ok, err := readPredictions(w.client, w.url)
		if w.state = unavailable(ok, err); w.state != "" {
			return nil
		}
		if p == after || time.Now().After(deadline) {
			after = p
			break
		}
		after = p
	}
	r := &predictionReport{modelPredictions: after.minus(w.before)}
	if n := r.Requests - r.NoCachedTokens; n > 0 {
		r.Accuracy = float64(r.CachedExact) / float64(n)
	}
	return r
}

// unavailable says why predictions cannot be read, "" when they can.
func unavailable(ok bool, err error) string {
	switch {
	case err != nil:
		return err.Error()
	case !ok:
		return "the gateway's /kv_router/stats has no predictions section"
	}
	return ""
}

// printPredictions prints each policy's prediction accuracy, or why there
// is none.
func printPredictions(w *predictionWatch, sums []summary) {
	if w == nil {
		return
	}
	fmt.Println()
	printed := false
	for _, s := range sums {
		p := s.Predictions
		if p == nil || p.Requests+p.NoUsage == 0 {
			continue
		}
		printed = true
		fmt.Printf("prediction accuracy (%s): %.3f of %d requests had predicted cached tokens = reported; prompt-token mismatches: %d\n",
			s.Policy, p.Accuracy, p.Requests-p.NoCachedTokens, p.PromptTokensMismatch)
		fmt.Printf("%-12s predicted %d cached tokens, reported %d; the engine had more %d times, less %d times; answers without usage %d, usage without cached tokens %d\n",
			"", p.PredictedCachedTokens, p.ReportedCachedTokens, p.CachedMore, p.CachedLess, p.NoUsage, p.NoCachedTokens)
	}
	switch {
	case w.state != "":
		fmt.Printf("prediction accuracy: not available (%s)\n", w.state)
	case !printed:
		fmt.Println("prediction accuracy: the gateway recorded no predictions during the runs")
	}
}
