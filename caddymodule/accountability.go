package caddymodule

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Prediction accountability: for every proxied request whose answer
// carries usage, what the gateway predicted (the prompt's length in
// tokens, the tokens cached on the chosen worker) is compared with what
// the engine reported. A tokenization that differs from the engine's (a
// doubled BOS, a template rendered without the tools, another block size)
// loses every cache hit without an error anywhere; this is where it shows:
// in kvrouter_prompt_tokens_mismatch_total, in the accuracy of the cached
// tokens predicted, in /kv_router/stats' "predictions", and in one
// warning a minute that names the likely cause.

// prediction is what the gateway predicted for one proxied request.
type prediction struct {
	model string
	chat  bool
	// promptTokens is the prompt's length as the gateway hashed it; 0
	// when the request was routed by load (no tokens to compare).
	promptTokens int
	// cachedTokens is the predicted prefix-cache hit on the chosen rank.
	cachedTokens uint64
	blockSize    uint32
}

// expectedCached is the hit the engine can report for the prediction.
// vLLM always computes a prompt's last token (its logits start the
// output), so a fully cached prompt reports its hit short by the block
// holding that token: at most the whole blocks of promptTokens-1.
func (p *prediction) expectedCached() uint64 {
	if p.promptTokens == 0 || p.blockSize == 0 {
		return p.cachedTokens
	}
	bs := uint64(p.blockSize)
	limit := uint64(p.promptTokens-1) / bs * bs
	return min(p.cachedTokens, limit)
}

// modelPredictions are one model's counts since the process started; they
// are the "predictions" section of /kv_router/stats.
type modelPredictions struct {
	// Requests are answers that carried usage.
	Requests uint64 `json:"requests"`
	// NoUsage are answers (2xx, complete) without usage: a stream that
	// did not ask for it, or an engine that does not write it.
	NoUsage uint64 `json:"no_usage"`
	// Implausible are usages left out of every count: prompt_tokens
	// negative or past maxUsageTokens, cached_tokens negative or past
	// prompt_tokens (usage.go, plausible).
	Implausible uint64 `json:"implausible_usage"`
	// NoCachedTokens are usages without prompt_tokens_details.cached_tokens
	// before the model's engines ever reported one (vLLM without
	// --enable-prompt-tokens-details, SGLang without
	// --enable-cache-report): nothing to compare the prediction with.
	NoCachedTokens uint64 `json:"no_cached_tokens"`
	// ReportsCached is true once an engine of the model reported cached
	// tokens; from then on a usage without them reports 0.
	ReportsCached bool `json:"reports_cached_tokens"`
	// PromptTokensMismatch are usages whose prompt_tokens differ from the
	// prompt the gateway routed (requests routed by load are not counted).
	PromptTokensMismatch uint64 `json:"prompt_tokens_mismatch"`
	// CachedExact are usages whose cached_tokens equal the prediction.
	CachedExact uint64 `json:"cached_exact"`
	// CachedMore are usages whose engine had more cached than predicted:
	// blocks stored after the selection (a request ahead of it in the
	// worker's queue prefilled them) or whose events had not arrived yet.
	CachedMore uint64 `json:"cached_more"`
	// CachedLess are usages whose engine had less cached than predicted:
	// blocks evicted after their events were indexed, or a wrong index.
	CachedLess uint64 `json:"cached_less"`
	// PredictedCachedTokens and ReportedCachedTokens sum the two sides
	// over the usages that had cached_tokens.
	PredictedCachedTokens uint64 `json:"predicted_cached_tokens"`
	ReportedCachedTokens  uint64 `json:"reported_cached_tokens"`
	// Accuracy is CachedExact over the usages that had cached_tokens.
	Accuracy float64 `json:"accuracy"`
}

// maxAccountedModels bounds the models counted apart; more are counted
// under otherModels. Models reach the ledger under their metric label
// (modellabels.go: catalog models, at most maxModelLabels of them, pruned
// when they leave), so this is a second guard, not a limit anyone should
// meet.
const maxAccountedModels = 1024

const otherModels = "(other models)"

// mismatchWarnEvery is how often one model's mismatch is logged.
const mismatchWarnEvery = time.Minute

// predictionLedger holds the counts per model. It is package-level, like
// the metrics, so the counts carry on across config reloads.
type predictionLedger struct {
	mu       sync.Mutex
	models   map[string]*modelPredictions
	lastWarn map[string]time.Time // by model and cause
}

// vLLM writes prompt_tokens_details only when it has something in it:
// with --enable-prompt-tokens-details, a request that found nothing
// cached has no details at all. So once a model's engines have reported
// cached tokens, a usage without them reports 0; before that, it says
// nothing (the engines may not report them at all).

var predictions = &predictionLedger{
	models:   map[string]*modelPredictions{},
	lastWarn: map[string]time.Time{},
}

// snapshot copies the counts for /kv_router/stats.
func (l *predictionLedger) snapshot() map[string]modelPredictions {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]modelPredictions, len(l.models))
	for k, v := range l.models {
		out[k] = *v
	}
	return out
}

// record compares one answer's usage (ok false: none was found) with the
// prediction, counts it, and warns about a mismatch at most once a minute
// per model and cause.
func (l *predictionLedger) record(p *prediction, u engineUsage, ok bool, logger *zap.Logger) {
	model := modelLabels.of(p.model)
	if !ok {
		l.count(model, func(m *modelPredictions) { m.NoUsage++ })
		usageReportsTotal.WithLabelValues(model, "absent").Inc()
		return
	}
	var reported *int64
	if u.PromptTokensDetails != nil {
		reported = u.PromptTokensDetails.CachedTokens
	}
	if !u.plausible() {
		l.count(model, func(m *modelPredictions) { m.Implausible++ })
		usageReportsTotal.WithLabelValues(model, "implausible").Inc()
		l.warn(logger, model, "implausible usage", "usage out of bounds, left out of the counts", p, u)
		return
	}
	usageReportsTotal.WithLabelValues(model, "read").Inc()
	mismatch := p.promptTokens > 0 && u.PromptTokens != int64(p.promptTokens)
	expected := p.expectedCached()
	var accuracy float64
	l.count(model, func(m *modelPredictions) {
		m.Requests++
		if reported != nil {
			m.ReportsCached = true
		} else if m.ReportsCached {
			reported = new(int64) // none cached: vLLM leaves the details out
		}
		if mismatch {
			m.PromptTokensMismatch++
		}
		if reported == nil {
			m.NoCachedTokens++
		} else {
			m.PredictedCachedTokens += expected
			m.ReportedCachedTokens += uint64(max(*reported, 0))
			switch got := uint64(max(*reported, 0)); {
			case got == expected:
				m.CachedExact++
			case got > expected:
				m.CachedMore++
			default:
				m.CachedLess++
			}
			if n := m.Requests - m.NoCachedTokens; n > 0 {
				m.Accuracy = float64(m.CachedExact) / float64(n)
			}
		}
		accuracy = m.Accuracy
	})
	if mismatch {
		promptTokensMismatch.WithLabelValues(model).Inc()
	}
	if reported != nil {
		predictedCachedTotal.WithLabelValues(model).Add(float64(expected))
		reportedCachedTotal.WithLabelValues(model).Add(float64(max(*reported, 0)))
		cachedPredictionError.WithLabelValues(model).Observe(float64(*reported) - float64(expected))
		predictionAccuracy.WithLabelValues(model).Set(accuracy)
	}
	if cause, what := mismatchCause(p, u, reported, mismatch); cause != "" {
		l.warn(logger, model, cause, what, p, u)
	}
}

// forget drops model's counts and warning times (it left the catalog).
func (l *predictionLedger) forget(model string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.models, model)
	for k := range l.lastWarn {
		if strings.HasPrefix(k, model+"\x00") {
			delete(l.lastWarn, k)
		}
	}
}

// count runs f on model's counts, under the lock.
func (l *predictionLedger) count(model string, f func(*modelPredictions)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.models[model]
	if m == nil {
		if len(l.models) >= maxAccountedModels {
			model = otherModels
		}
		if m = l.models[model]; m == nil {
			m = new(modelPredictions)
			l.models[model] = m
		}
	}
	f(m)
}

// warn logs one mismatch, unless the same model and cause was logged in
// the last minute.
func (l *predictionLedger) warn(logger *zap.Logger, model, cause, what string, p *prediction, u engineUsage) {
	now := time.Now()
	key := model + "\x00" + cause
	l.mu.Lock()
	last, seen := l.lastWarn[key]
	if seen && now.Sub(last) < mismatchWarnEvery {
		l.mu.Unlock()
		return
	}
	if len(l.lastWarn) < 4*maxAccountedModels {
		l.lastWarn[key] = now
	}
	l.mu.Unlock()
	logger.Warn("the engine did not see the prompt the gateway predicted",
		zap.String("model", model), zap.String("likely_cause", cause), zap.String("detail", what),
		zap.Int("predicted_prompt_tokens", p.promptTokens), zap.Int64("reported_prompt_tokens", u.PromptTokens),
		zap.Uint32("block_size", p.blockSize))
}

// mismatchCause names the likely cause of a disagreement, or "" when the
// engine's usage agrees with the prediction (or says too little to tell).
// A prompt off by a token or two is a special token (a BOS doubled or
// missing); by more on a chat request, the template rendered something
// /tokenize did not (tools, documents, a per-request template or its
// arguments); by more on a text prompt, another tokenizer. With equal
// prompts, a cache hit that is not a whole number of the partition's
// blocks says the engine's blocks are another size.
func mismatchCause(p *prediction, u engineUsage, reported *int64, mismatch bool) (cause, what string) {
	if mismatch {
		d := u.PromptTokens - int64(p.promptTokens)
		switch {
		case d >= -2 && d <= 2:
			return "special_tokens", fmt.Sprintf("the engine prefilled %+d token(s) against /tokenize: a BOS or EOS added or missing. "+
				"vLLM's chat route tokenizes with add_special_tokens false (the template writes BOS), its completions route with true; "+
				"a client or engine that changes either makes the gateway hash another prompt", d)
		case p.chat:
			return "chat_template", fmt.Sprintf("the engine prefilled %+d token(s) against /tokenize: its chat template rendered the request "+
				"differently (tools, documents, chat_template, chat_template_kwargs, add_generation_prompt or continue_final_message)", d)
		default:
			return "tokenizer", fmt.Sprintf("the engine prefilled %+d token(s) against /tokenize: the worker that tokenized "+
				"uses another tokenizer than the one that served", d)
		}
	}
	if reported != nil && p.blockSize > 0 && *reported > 0 && *reported%int64(p.blockSize) != 0 {
		return "block_size", fmt.Sprintf("the engine reported %d cached tokens, not a whole number of the partition's %d-token blocks: "+
			"the engine's --block-size (SGLang: --page-size) must equal the worker's block_size", *reported, p.blockSize)
	}
	return "", ""
}

// Accountability metrics, labelled by model (a catalog model: the label's
// values are bounded by the catalog).
var (
	usageReportsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_usage_reports_total",
		Help: "Complete 2xx answers to routed requests, by whether the gateway found the engine's usage in them (read) or not (absent: a stream without stream_options.include_usage), or found one out of bounds (implausible: left out of the other counts).",
	}, []string{"model", "outcome"})
	promptTokensMismatch = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_prompt_tokens_mismatch_total",
		Help: "Answers whose usage.prompt_tokens differ from the prompt the gateway tokenized and routed: the gateway hashed another prompt than the engine prefilled.",
	}, []string{"model"})
	predictedCachedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_cached_tokens_predicted_total",
		Help: "Cached prompt tokens the gateway predicted on the chosen worker, over answers whose usage reported cached tokens.",
	}, []string{"model"})
	reportedCachedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_cached_tokens_reported_total",
		Help: "Cached prompt tokens the engines reported (usage.prompt_tokens_details.cached_tokens).",
	}, []string{"model"})
	cachedPredictionError = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "kvrouter_cached_tokens_prediction_error",
		Help: "Reported minus predicted cached tokens of one request: 0 when the prediction was exact, negative when the gateway expected more cache than the engine had.",
		// Symmetric: zero, then a block or two, then whole contexts.
		Buckets: []float64{-65536, -16384, -4096, -1024, -256, -64, -16, -1, 0, 16, 64, 256, 1024, 4096, 16384, 65536},
	}, []string{"model"})
	predictionAccuracy = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvrouter_prediction_accuracy_ratio",
		Help: "Share of answers with reported cached tokens whose count equalled the gateway's prediction, since the process started.",
	}, []string{"model"})
)
