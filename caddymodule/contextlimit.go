package caddymodule

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// contextLimits knows, per partition, the contexts (max_model_len) its
// workers reported. vLLM refuses, with a 400, a request whose prompt and
// output do not fit its context (contextNeed), so:
//
//   - a request no worker's context fits is routed by load. A prompt given
//     as token ids reaches the gateway whole (up to the body's bound, some
//     4 million ids); hashing it, scoring it and booking its blocks (in
//     approximate mode, recording them as cached for approx_ttl) would be
//     work for an answer known in advance, and in approximate mode a
//     wrong one;
//   - a request that fits some workers' contexts and not others' goes to
//     those it fits. Otherwise a growing conversation, whose cached prefix
//     draws it back to the worker holding it, would be sent again and
//     again to the worker that must refuse it (the proxy does not fail
//     over on a 400).
//
// The figures, and the sets of workers a request may go to, are made once
// a version of the model's workers (Catalog.ModelVersion), outside the
// lock, so the request path reads no worker records and another model's
// changes, or a rebuild, hold up no request.
type contextLimits struct {
	catalog *selection.Catalog

	mu     sync.Mutex
	byPart map[contextKey]versionedContexts
}

// contextKey names a set of workers a request may go to: a partition's,
// or those of its workers that serve a LoRA adapter, when the request
// names one (only they may take it).
type contextKey struct {
	part    selection.PartitionKey
	adapter string
}

type versionedContexts struct {
	version  uint64 // the model's version the figures are of
	contexts partContexts
}

// partContexts are a partition's contexts: the longest (0 when a worker
// did not report its own, which bounds nothing) and the shortest one
// reported (0 when none was), and, for each context some worker
// reported, the workers a request needing that much may go to.
type partContexts struct {
	longest, shortest uint64
	// tiers are the distinct contexts reported, shortest first, each with
	// the workers whose context is at least that long or unknown: made
	// once a version of the model's workers, shared by the requests (read
	// only). Past maxContextTiers distinct contexts they are not made, and
	// a request that fits only some workers builds its set from workers.
	tiers []contextTier
	// unreported are the workers that reported no context, with tiers.
	unreported map[uint64]bool
	workers    []workerContext
	// tokenizers are the schedulable workers' endpoints, which /tokenize
	// asks in turn, and tokenizeLimit the longest of their contexts (0
	// when one reported none): a prompt of more tokens fits none of them
	// (tokenize.go).
	tokenizers    []string
	tokenizeLimit uint64
}

type contextTier struct {
	context uint64
	allowed map[uint64]bool
}

type workerContext struct {
	id, context uint64 // context 0: not reported
}

// maxContextTiers bounds the sets kept per partition: a fleet runs one or
// a few contexts a model, and each set holds up to every worker.
const maxContextTiers = 4

// maxContextEntries bounds the partitions (and adapters) whose contexts
// are kept: past it the map starts again, so the names of partitions long
// gone do not pile up.
const maxContextEntries = 4096

func newContextLimits(c *selection.Catalog) *contextLimits {
	return &contextLimits{catalog: c, byPart: make(map[contextKey]versionedContexts)}
}

// of is the contexts of part's workers (those serving adapter, when it is
// not ""), zero when unknown (no bound then).
func (c *contextLimits) of(part selection.PartitionKey, adapter string) partContexts {
	if c == nil {
		return partContexts{}
	}
	// The version is read before the workers: figures made of workers
	// newer than their version are made again, never the reverse.
	v := c.catalog.ModelVersion(part.Model)
	if v == 0 {
		return partContexts{} // no worker names the model
	}
	key := contextKey{part, adapter}
	c.mu.Lock()
	e, ok := c.byPart[key]
	c.mu.Unlock()
	if ok && e.version == v {
		return e.contexts
	}
	var workers []selection.WorkerRecord
	for _, w := range c.catalog.ListWorkers(part.Model, part.Group) {
		if servesAdapter(&w, adapter) {
			workers = append(workers, w)
		}
	}
	if len(workers) == 0 {
		// Not kept: the partition is a client's name until a worker
		// serves it, and names would grow the map without bound.
		return partContexts{}
	}
	pc := contextsOf(workers)
	c.mu.Lock()
	if len(c.byPart) >= maxContextEntries {
		clear(c.byPart)
	}
	c.byPart[key] = versionedContexts{version: v, contexts: pc}
	c.mu.Unlock()
	return pc
}

// contextsOf reads a partition's workers' contexts.
func contextsOf(workers []selection.WorkerRecord) partContexts {
	var pc partContexts
	unbounded := false
	var distinct []uint64
	for i := range workers {
		l := contextOf(&workers[i])
		pc.workers = append(pc.workers, workerContext{id: workers[i].WorkerID, context: l})
		if l == 0 {
			unbounded = true
			continue
		}
		pc.longest = max(pc.longest, l)
		if pc.shortest == 0 || l < pc.shortest {
			pc.shortest = l
		}
		if !slices.Contains(distinct, l) {
			distinct = append(distinct, l)
		}
	}
	if unbounded {
		pc.longest = 0
	}
	pc.tokenizers, pc.tokenizeLimit = tokenizersOf(workers)
	if len(distinct) <= maxContextTiers {
		slices.Sort(distinct)
		for _, l := range distinct {
			pc.tiers = append(pc.tiers, contextTier{context: l, allowed: pc.fitting(l)})
		}
		pc.unreported = pc.fitting(math.MaxUint64)
	}
	return pc
}

// tokenizersOf are the endpoints of the schedulable workers, and the
// longest of their contexts, 0 when one of them reported none.
func tokenizersOf(workers []selection.WorkerRecord) (endpoints []string, limit uint64) {
	unknown := false
	for i := range workers {
		w := &workers[i]
		if !w.Schedulable() || w.Endpoint == nil {
			continue
		}
		endpoints = append(endpoints, *w.Endpoint)
		if l := contextOf(w); l > 0 {
			limit = max(limit, l)
		} else {
			unknown = true
		}
	}
	if unknown {
		limit = 0
	}
	return endpoints, limit
}

// contextOf is w's context, 0 when it reported none.
func contextOf(w *selection.WorkerRecord) uint64 {
	if w.MaxModelLen == nil {
		return 0
	}
	return *w.MaxModelLen
}

// fitting is the set of workers whose context fits need tokens (or is
// unknown).
func (pc *partContexts) fitting(need uint64) map[uint64]bool {
	set := make(map[uint64]bool, len(pc.workers))
	for _, w := range pc.workers {
		if w.context == 0 || need <= w.context {
			set[w.id] = true
		}
	}
	return set
}

// contextFiltered counts the requests the context filter acted on, so an
// operator sees prompts outgrowing a model's workers: narrowed (sent only
// to the workers whose context fits) and over (no worker's fits: routed
// by load, and refused by the engine).
var contextFiltered = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "kvrouter_context_filtered_total",
	Help: "Proxied requests whose prompt and max_tokens do not fit every worker's context (max_model_len), by model and outcome (narrowed: sent only to the workers whose context fits; over: no worker's fits, routed by load).",
}, []string{"model", "outcome"})

// differ reports whether part's workers (those serving adapter, when it
// is not "") may take a request or refuse it for its length unlike each
// other: their contexts differ, or some reported one and some did not.
func (c *contextLimits) differ(part selection.PartitionKey, adapter string) bool {
	pc := c.of(part, adapter)
	return pc.shortest != 0 && (pc.longest == 0 || pc.shortest < pc.longest)
}

// contextFit is where a request may go among a partition's workers for
// its context: allowed (nil: any), and the shortest context among them
// (0 when any worker may take it; math.MaxUint64 when only workers that
// reported no context may), which names the set (the overload queue's
// lines: lineScope).
type contextFit struct {
	allowed map[uint64]bool
	context uint64
}

// place says where a request needing need tokens of context
// (contextNeed) may go among part's workers (those serving adapter, when
// the request may go only to them): nowhere (over, every worker's context
// is too short), or where fit says. The set is shared: the caller must
// not change it.
func (c *contextLimits) place(part selection.PartitionKey, adapter string, need uint64) (over bool, fit contextFit) {
	pc := c.of(part, adapter)
	switch {
	case pc.longest > 0 && need > pc.longest:
		contextFiltered.WithLabelValues(modelLabels.of(part.Model), "over").Inc()
		return true, contextFit{}
	case pc.shortest == 0 || need <= pc.shortest:
		return false, contextFit{}
	}
	contextFiltered.WithLabelValues(modelLabels.of(part.Model), "narrowed").Inc()
	for _, t := range pc.tiers {
		if need <= t.context {
			return false, contextFit{t.allowed, t.context}
		}
	}
	if pc.tiers != nil {
		// Past every reported context: the workers that reported none.
		return false, contextFit{pc.unreported, math.MaxUint64}
	}
	shortest := uint64(math.MaxUint64)
	for _, w := range pc.workers {
		if w.context >= need {
			shortest = min(shortest, w.context)
		}
	}
	return false, contextFit{pc.fitting(need), shortest}
}

// outputFields are the request's bounds on its answer, which the engine
// sets aside in the context with the prompt.
type outputFields struct {
	MaxTokens           selection.RawJSON `json:"max_tokens"`
	MaxCompletionTokens selection.RawJSON `json:"max_completion_tokens"`
	// SGLang's /generate: sampling_params.max_new_tokens.
	SamplingParams selection.RawJSON `json:"sampling_params"`
}

// vllmCompletionMaxTokens is max_tokens on vLLM's /v1/completions when the
// request has none.
const vllmCompletionMaxTokens = 16

// contextNeed is the context a request with a prompt of n tokens needs,
// as its engine checks it:
//   - vLLM's /v1/completions: the prompt and max_tokens, 16 when the
//     member is absent; null asks for what the context leaves, so the
//     prompt needs room for one token;
//   - vLLM's chat: max_completion_tokens or max_tokens, as Python's "or"
//     reads them (null and 0 fall through), else one token;
//   - SGLang's /generate: SGLang refuses a total that reaches its context,
//     so one more than the prompt and sampling_params.max_new_tokens.
//
// A value the engine refuses in any case counts as one token.
func (o *openAIRequest) contextNeed(r *http.Request, n int) uint64 {
	prompt := uint64(n)
	out := func(v selection.RawJSON) (uint64, bool) {
		m, ok := laxInt(v)
		return uint64(max(m, 1)), ok && m != 0
	}
	switch {
	case isGenerate(r):
		if m, ok := out(maxNewTokens(o.SamplingParams)); ok {
			return prompt + m + 1
		}
		return prompt + 1
	case isChat(r):
		if m, ok := out(o.MaxCompletionTokens); ok {
			return prompt + m
		}
		if m, ok := out(o.MaxTokens); ok {
			return prompt + m
		}
		return prompt + 1
	case len(o.MaxTokens) == 0:
		return prompt + vllmCompletionMaxTokens
	default:
		if m, ok := out(o.MaxTokens); ok {
			return prompt + m
		}
		return prompt + 1
	}
}

// maxNewTokens is sampling_params' max_new_tokens (a batch of one's, in
// its list form), nil when absent. Of a list only the first element is
// read: a body can hold a list of millions.
func maxNewTokens(params selection.RawJSON) selection.RawJSON {
	if t := bytes.TrimSpace(params); len(t) > 0 && t[0] == '[' {
		dec := json.NewDecoder(bytes.NewReader(t[1:]))
		var first json.RawMessage
		if dec.Decode(&first) != nil || dec.More() {
			return nil // not a batch of one: routed by load elsewhere
		}
		params = selection.RawJSON(first)
	}
	var sp struct {
		MaxNewTokens json.RawMessage `json:"max_new_tokens"`
	}
	if len(params) == 0 || json.Unmarshal(params, &sp) != nil {
		return nil
	}
	return selection.RawJSON(sp.MaxNewTokens)
}
