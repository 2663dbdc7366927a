package caddymodule

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func newLedger() *predictionLedger {
	return &predictionLedger{models: map[string]*modelPredictions{}, lastWarn: map[string]time.Time{}}
}

// usageOf is a usage with prompt tokens and, unless cached is negative,
// prompt_tokens_details.cached_tokens.
func usageOf(prompt, cached int64) engineUsage {
	u := engineUsage{PromptTokens: prompt}
	if cached >= 0 {
		u.PromptTokensDetails = &cachedDetail{CachedTokens: &cached}
	}
	return u
}

func TestPredictionLedger(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	logger := zap.New(core)
	l := newLedger()
	p := prediction{model: "m", promptTokens: 64, cachedTokens: 32, blockSize: 16}
	// Before any engine reported cached tokens, a usage without them
	// says nothing about the prediction.
	l.record(&p, usageOf(64, -1), true, logger)
	// Exact: 32 predicted, 32 reported.
	l.record(&p, usageOf(64, 32), true, logger)
	// From now on no details means none cached: a miss of 32.
	l.record(&p, usageOf(64, -1), true, logger)
	// An answer without usage.
	l.record(&p, engineUsage{}, false, logger)
	// A doubled BOS, twice: one warning.
	l.record(&p, usageOf(65, 32), true, logger)
	l.record(&p, usageOf(65, 32), true, logger)
	got := l.snapshot()["m"]
	want := modelPredictions{Requests: 5, NoUsage: 1, NoCachedTokens: 1, ReportsCached: true, PromptTokensMismatch: 2,
		CachedExact: 3, CachedLess: 1, PredictedCachedTokens: 4 * 32, ReportedCachedTokens: 3 * 32, Accuracy: 0.75}
	if got != want {
		t.Fatalf("counts %+v\nwant   %+v", got, want)
	}
	if n := logs.FilterField(zap.String("likely_cause", "special_tokens")).Len(); n != 1 || logs.Len() != 1 {
		t.Fatalf("%d warnings (%d naming special tokens), want one", logs.Len(), n)
	}
}

// TestImplausibleUsageIsLeftOut: a usage no engine can write (cached
// tokens past the prompt's, negative or astronomical figures) is counted
// as implausible and left out of every other count: one answer's
// cached_tokens of 9e18 wrapped the model's reported-tokens counter and
// took its accuracy from 1 to 0.73.
func TestImplausibleUsageIsLeftOut(t *testing.T) {
	l := newLedger()
	p := prediction{model: "m", promptTokens: 64, cachedTokens: 32, blockSize: 16}
	l.record(&p, usageOf(64, 32), true, zap.NewNop())
	negative := usageOf(64, 0)
	*negative.PromptTokensDetails.CachedTokens = -5
	for _, u := range []engineUsage{usageOf(64, 9e18), usageOf(64, 65), usageOf(-1, -1), usageOf(1<<40, 0), negative} {
		l.record(&p, u, true, zap.NewNop())
	}
	want := modelPredictions{Requests: 1, Implausible: 5, ReportsCached: true, CachedExact: 1,
		PredictedCachedTokens: 32, ReportedCachedTokens: 32, Accuracy: 1}
	if got := l.snapshot()["m"]; got != want {
		t.Fatalf("counts %+v\nwant   %+v", got, want)
	}
}
