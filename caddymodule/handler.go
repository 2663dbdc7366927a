package caddymodule

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/kvrouter/caddy-kvrouter/selection"
	"github.com/kvrouter/caddy-kvrouter/selection/api"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler is the kv_router handler. Placed before reverse_proxy, it reads
// an OpenAI-style request's body once, finds the prompt's tokens, and
// reserves the worker where the prompt costs least (most cached prefix,
// least queued work) through the kv_router app's router. lb_policy
// kv_router then sends the request to that worker, and the reservation
// follows the response: its first byte marks prefill complete, and its end
// (or a client cancel, an upstream error or an aborted stream) frees it.
//
// Tokens come from the body's token_ids (an extension field), or from an
// integer-array prompt on /v1/completions; otherwise, with tokenize on, a
// worker of the request's model is asked through vLLM's POST /tokenize. A
// request whose tokens cannot be had is still served, routed by load.
//
// The response carries X-KVRouter-Worker and X-KVRouter-Cached-Tokens (and
// X-KVRouter-Explain with explain on); the same values are the
// placeholders {http.kv_router.worker}, {http.kv_router.dp_rank},
// {http.kv_router.cached_tokens} and {http.kv_router.endpoint}.
type Handler struct {
	// MaxBodySize is the largest request body read, in bytes; a larger one
	// is answered with 413. Default: 16777216 (16 MiB).
	MaxBodySize int64 `json:"max_body_size,omitempty"`

	// BodyTimeout bounds the time a request's body takes to arrive, from
	// the handler's first read of it; past it the request is answered 408
	// and its connection closed, so a client that sends a byte now and
	// then cannot hold a connection and a body buffer for ever (Caddy's
	// servers set no such bound by default). Default: 30s.
	BodyTimeout caddy.Duration `json:"body_timeout,omitempty"`

	// RoutingGroupHeader names the request header that selects the routing
	// group within the model. Default: X-Routing-Group.
	RoutingGroupHeader string `json:"routing_group_header,omitempty"`

	// SessionHeader names the request header that carries the session id
	// for session affinity; the body's session_id is used when it is
	// absent. Default: X-Session-ID.
	SessionHeader string `json:"session_header,omitempty"`

	// Tokenize asks a worker for the tokens of text prompts and chat
	// messages through POST /tokenize, with every field of the request
	// that the engine's chat template or tokenizer reads and vLLM's
	// defaults for those the client left out (chat: add_special_tokens
	// false, add_generation_prompt true; completions: add_special_tokens
	// true), so the tokens are the ones the engine will prefill. A worker
	// that cannot answer is replaced by another of the model's (up to
	// three). Default: true.
	Tokenize *bool `json:"tokenize,omitempty"`

	// TokenizeTimeout bounds the /tokenize calls of one request, retries
	// included; past it the request is routed by load. Default: 500ms.
	TokenizeTimeout caddy.Duration `json:"tokenize_timeout,omitempty"`

	// TokenizeCache bounds the cache of /tokenize answers, in
	// tokens (4 bytes each): a request whose /tokenize body is the same
	// as an earlier one's (a retry, n samples sent as n requests, an
	// unchanged conversation) is not tokenized again. Each answer is
	// charged 40 tokens more for its bookkeeping, so the bound holds
	// for many tiny answers too. 0 turns it off. Default: 4194304
	// (16 MiB).
	TokenizeCache *int `json:"tokenize_cache,omitempty"`

	// RequestUsage asks the worker for usage on a streamed request that
	// did not (one with stream true and no stream_options): the request
	// goes on with stream_options.include_usage true, the worker's usage
	// chunk is read to check the gateway's prediction, and it is not
	// passed to the client, which gets the stream it asked for. Default:
	// true.
	RequestUsage *bool `json:"request_usage,omitempty"`

	// Explain adds X-KVRouter-Explain to responses: for the cheapest
	// candidates, their cached blocks, load and cost. Default: false.
	Explain bool `json:"explain,omitempty"`

	// Overload holds requests back while every worker of their model is
	// busy, in a bounded queue with priority classes, and marks workers
	// that answer "overloaded" busy rather than failed
	// (overload_config.go, docs/overload.md). Default: on, with the
	// defaults of OverloadConfig.
	Overload *OverloadConfig `json:"overload,omitempty"`

	overload  overloadSettings
	queue     *overloadQueue // nil with the queue off
	router    *selection.Router
	tokenizer *tokenizer
	contexts  *contextLimits
	logger    *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.kv_router",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision binds the handler to the kv_router app's router.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	if err := h.Validate(); err != nil {
		return err
	}
	app, err := kvApp(ctx)
	if err != nil {
		return err
	}
	h.router = app.Router()
	h.contexts = newContextLimits(h.router.Catalog())
	if h.overload, err = h.Overload.settings(); err != nil {
		return err
	}
	if !h.overload.off {
		h.queue = newOverloadQueue(h.overload, h.router.PartitionBusy)
	}
	if h.MaxBodySize == 0 {
		h.MaxBodySize = 16 << 20
	}
	if h.BodyTimeout == 0 {
		h.BodyTimeout = caddy.Duration(defaultBodyTimeout)
	}
	if h.RoutingGroupHeader == "" {
		h.RoutingGroupHeader = "X-Routing-Group"
	}
	if h.SessionHeader == "" {
		h.SessionHeader = "X-Session-ID"
	}
	timeout := time.Duration(h.TokenizeTimeout)
	if timeout == 0 {
		timeout = 500 * time.Millisecond
	}
	if h.Tokenize == nil || *h.Tokenize {
		cacheTokens := 4 << 20
		if h.TokenizeCache != nil {
			cacheTokens = *h.TokenizeCache
		}
		h.tokenizer = newTokenizer(h.router, timeout, cacheTokens)
	}
	return nil
}

// Cleanup answers the requests waiting in the overload queue with 429,
// and closes the tokenizer's idle connections: the handler is going away.
func (h *Handler) Cleanup() error {
	if h.queue != nil {
		h.queue.close()
	}
	h.tokenizer.close()
	return nil
}

// Validate checks the handler's settings.
func (h *Handler) Validate() error {
	if h.MaxBodySize < 0 {
		return errors.New("max_body_size must not be negative")
	}
	if h.TokenizeTimeout < 0 || h.BodyTimeout < 0 {
		return errors.New("tokenize_timeout and body_timeout must not be negative")
	}
	if h.TokenizeCache != nil && *h.TokenizeCache < 0 {
		return errors.New("tokenize_cache must not be negative")
	}
	_, err := h.Overload.settings()
	return err
}

// openAIRequest is what the handler reads of a completions or chat body.
// token_ids (through the embedded Prompt) and an integer-array prompt
// (through PromptTokens) are read by the fast token decoder; a text prompt
// or messages are kept raw for /tokenize.
type openAIRequest struct {
	selection.TokenPrompt
	Model     string            `json:"model"`
	RawPrompt selection.RawJSON `json:"prompt"`
	Messages  selection.RawJSON `json:"messages"`
	SessionID string            `json:"session_id"`
	// What else the engine's tokenizer or chat template reads, passed on
	// to /tokenize as the client sent it (tokenize.go).
	templateFields
	// Whether a stream asked for usage (stream_usage.go).
	streamFields
	// Whether the engine reads its prefix cache for it (cacheread.go).
	cacheReadFields
	// How the engine cuts the prompt (truncate.go).
	truncateFields
	// What the answer may take of the context (contextlimit.go).
	outputFields
	// SGLang's adapter and cache-namespace members (sglangfields.go).
	sglangFields
	// SGLang's /generate prompt (generate.go).
	generateFields

	promptTokens []uint32
}

// PromptTokens implements selection.PromptTokenCarrier.
func (o *openAIRequest) PromptTokens() *[]uint32 { return &o.promptTokens }

// ExactNames implements selection.ExactNames: the engine reads a member
// under its exact name only ("MODEL" is not its model), and so must the
// gateway that routes and tokenizes for it.
func (*openAIRequest) ExactNames() {}

// bodies pools request body buffers.
var bodies = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

// requests pools the decoded bodies with their token buffers: a request's
// buffers are reused once its response is done.
var requests = sync.Pool{New: func() any { return new(openAIRequest) }}

func putRequest(o *openAIRequest) {
	tokens, prompt, ids := o.TokenIDs[:0], o.promptTokens[:0], o.inputIDs[:0]
	*o = openAIRequest{}
	o.TokenIDs, o.promptTokens, o.inputIDs = tokens, prompt, ids
	requests.Put(o)
}

// ServeHTTP reserves a worker for the request and passes it on. The
// errors it decides, and the worker failures reverse_proxy returns, are
// answered in OpenAI's error shape (openai_errors.go).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if r.Method == http.MethodGet && r.URL.Path == "/v1/models" {
		return h.serveModels(w) // every catalog model, not one worker's (models.go)
	}
	// Every request passed on is marked, whatever its method: a GET
	// that came back went round until a header grew too large.
	if cameBack(r) {
		return h.refuse(w, http.StatusLoopDetected, errLoop)
	}
	if r.Method != http.MethodPost || r.Body == nil || r.Body == http.NoBody {
		return next.ServeHTTP(w, r)
	}
	arrived := time.Now()
	bufp := bodies.Get().(*[]byte)
	lease := new(bodyLease)
	body, status, err := h.readBody(w, r, (*bufp)[:0], lease)
	if err != nil {
		bodies.Put(bufp)
		return h.refuse(w, status, err)
	}
	// The buffer is reused once the proxy is done with it: at once when
	// the request never reached it, else once no reader of it is left
	// open (bodylease.go).
	proxied := false
	defer func() {
		if !proxied || lease.idle() {
			*bufp = body[:0]
			bodies.Put(bufp)
		}
	}()
	oai := requests.Get().(*openAIRequest)
	if boundary, form := isForm(r); form {
		// An audio route's form (formbody.go): routed by load.
		model, err := formModel(body, boundary)
		if err != nil {
			putRequest(oai)
			return h.refuse(w, http.StatusBadRequest, err)
		}
		oai.Model = model
	} else if err := selection.DecodeJSON(body, oai); err != nil {
		putRequest(oai)
		return h.refuse(w, selection.StatusOf(err), err)
	}
	// The reservation refers to oai's token buffers until it is released.
	defer putRequest(oai)
	if isGenerate(r) {
		oai.Model = "" // SGLang's /generate has no model member: the engine's own model serves it
	}
	if oai.Model == "" {
		// vLLM serves a request that names no model with its one model.
		// With several, the request goes to the selection API's default
		// model ("default"), or is a 404 when there is none such.
		if model, ok := h.router.Catalog().OnlyModel(); ok {
			oai.Model = model
		}
	}
	req := &selection.SelectRequest{
		Partition: selection.Partition{ModelName: oai.Model, RoutingGroup: r.Header.Get(h.RoutingGroupHeader)},
		Placement: selection.Placement{SessionID: r.Header.Get(h.SessionHeader)},
		Lean:      true,
		// In approximate mode, the prompt counts as cached on its worker
		// once the worker answers 2xx and sends its first byte: a 400 (a
		// prompt the engine refused), a worker failed over from, or a
		// stream left after its headers caches nothing.
		RecordOnAnswer: true,
	}
	if req.Placement.SessionID == "" {
		req.Placement.SessionID = oai.SessionID
	}
	// A LoRA adapter's request goes to the workers of its base model that
	// serve it, hashed with its name as the engine hashes its blocks, and
	// is tokenized by one of them (models.go).
	tr := r
	adapter := routeAdapter(h.router.Catalog(), req)
	if adapter == "" {
		adapter = sglangAdapter(h.router.Catalog(), req, &oai.sglangFields)
	}
	if adapter != "" {
		tr = r.WithContext(withTokenizeAdapter(r.Context(), adapter))
	}
	// The prompt is hashed with the request's cache_salt, and with an
	// adapter's name only when the request names one the engine's way
	// (its model, or SGLang's forms): lora_name is a selection-API member
	// no engine route reads, which would only mislead the gateway.
	// Only to workers whose context fits it (contextlimit.go).
	only := onlyAdapter(req, adapter)
	var fit contextFit
	req.TokenIDs, fit = h.routingTokens(tr, oai, req.Partition.Key(), only)
	req.Placement.AllowedSet = fit.allowed
	if req.TokenIDs != nil {
		req.CacheSalt = oai.CacheSalt
	}
	if adapter != "" {
		req.LoraName = adapter
	}
	mode := "kv"
	if req.TokenIDs == nil {
		// No tokens: book the request by load alone (an empty prompt).
		mode, req.TokenIDs = "load", []uint32{}
	}
	// Through the overload queue when every worker is busy
	// (overload_handler.go).
	res, took, answered, err := h.reserve(w, r, req, lineScope{adapter: only, context: fit.context}, mode)
	if answered {
		return nil
	}
	if err != nil {
		// A model no worker serves (404), or a served one none of whose
		// workers can take the request now (none schedulable, a hard
		// session binding refused it): say so rather than leave the
		// request to the fallback policy, which would send it to a worker
		// of another model.
		status := selection.StatusOf(err)
		if status == http.StatusNotFound {
			// Not the client's model name: a label per name would let
			// clients grow the metrics without bound.
			requestsTotal.WithLabelValues("", "unknown_model", "none").Inc()
		} else {
			requestsTotal.WithLabelValues(modelLabels.of(req.Partition.Key().Model), "refused", mode).Inc()
		}
		return h.refuse(w, status, err)
	}
	// Runs on return, on panic(http.ErrAbortHandler) and after a client
	// cancel; the freed capacity may admit a waiting request.
	defer h.kickQueue(req.Partition)
	defer res.Release()
	observeSelection(res.Response(), len(req.TokenIDs), mode, took)
	d := &decision{res: res, explain: h.Explain}
	caddyhttp.SetVar(r.Context(), decisionVar, d)
	d.annotate(w, r)
	out := http.ResponseWriter(w)
	var strip *usageStripper
	if (h.RequestUsage == nil || *h.RequestUsage) && oai.wantsUsageAdded() && !isGenerate(r) && addUsageOption(r, body, lease) {
		strip = newUsageStripper(w)
		out = strip
	}
	pw := newPrefillWriter(out, res, arrived)
	pw.overload, pw.health = &h.overload, h.router.Health()
	if h.queue != nil {
		pw.prefilled = func() { h.kickQueue(req.Partition) }
	}
	defer pw.done()
	complete := false // the worker's whole answer was passed on
	if predicted(r) {
		// Deferred, so that it runs on panic(http.ErrAbortHandler) too:
		// reverse_proxy aborts so when the client leaves mid-answer (a
		// client that stops reading at [DONE] and hangs up while the
		// worker still holds the stream open), and the usage may have come
		// already. Counted in the return, a third of a benchmark's
		// answers went uncounted.
		defer func() { h.account(pw, req, mode, isChat(r), isGenerate(r), complete) }()
	}
	proxied = true
	err = next.ServeHTTP(pw, r)
	complete = err == nil
	if strip != nil {
		strip.finish()
	}
	if status, failed := proxyFailure(err); failed {
		// reverse_proxy got no answer from the worker (or none in time):
		// its own 502, 503 or 504 stands for the worker's, a failure to
		// the router's health.
		res.Answered(status)
		if !pw.wroteHeader {
			if c := h.logger.Check(zap.InfoLevel, "worker failed"); c != nil {
				c.Write(zap.Int("status", status), zap.Error(err))
			}
			writeOpenAIError(w, status, proxyFailureMessage(status))
			return nil
		}
	}
	return err
}

// isChat reports whether r is a chat completion, whose prompt the engine
// renders with its chat template.
func isChat(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, "/chat/completions") }

// predicted reports whether r's route is one whose answers report usage
// the prediction counters read: completions, chat completions and SGLang's
// /generate. Others (vLLM's /v1/responses, whose usage names its cached
// tokens otherwise; the audio routes; embeddings) are routed, not counted.
func predicted(r *http.Request) bool {
	return strings.HasSuffix(r.URL.Path, "/completions") || isGenerate(r)
}

// account compares the prediction made for req with the usage the engine
// reported in a 2xx answer (accountability.go). An answer cut short after
// its usage (a client that hung up after the last chunk, before the
// worker's end of stream) still counts; one cut before it, or one the
// worker compressed, has no usage to read: the first is not counted, the
// second counts as an answer without usage.
func (h *Handler) account(pw *prefillWriter, req *selection.SelectRequest, mode string, chat, generate, complete bool) {
	resp := pw.res.Response()
	if resp == nil || pw.status < 200 || pw.status > 299 {
		return
	}
	find := findUsage
	if generate {
		find = findMetaInfo // SGLang's /generate reports in meta_info
	}
	u, ok := find(pw.tail.buf)
	if !ok && !complete {
		return
	}
	p := prediction{model: resp.ModelName, chat: chat, cachedTokens: resp.ExpectedCachedTokens, blockSize: resp.BlockSize}
	if mode == "kv" {
		p.promptTokens = len(req.TokenIDs)
	}
	predictions.record(&p, u, ok, h.logger)
}

// refuse answers a request the handler will not pass on, in OpenAI's
// error shape; the error's text is the message (it never holds prompt
// content: decode errors name the field and offset only).
func (h *Handler) refuse(w http.ResponseWriter, status int, err error) error {
	if c := h.logger.Check(zap.DebugLevel, "request refused"); c != nil {
		c.Write(zap.Int("status", status), zap.Error(err))
	}
	writeOpenAIError(w, status, err.Error())
	return nil
}

// routingTokens are the tokens the engine will prefill: the prompt's, cut
// as the request asks (truncate.go); nil when the request is routed by
// load, which includes a request too long for every worker's context:
// the engine refuses it, and nothing of it is worth hashing or booking.
// fit says which workers' context fits the request when some do not,
// among those serving adapter when it is not "" (the request may go only
// to them). A request routed by load whose prompt is
// token ids goes only to workers it fits too (idprompts.go).
func (h *Handler) routingTokens(r *http.Request, oai *openAIRequest, part selection.PartitionKey, adapter string) (toks []uint32, fit contextFit) {
	toks, lengthOnly := h.tokens(r, oai, part, adapter)
	if toks == nil {
		if n, ok := oai.longestIDPrompt(r); ok {
			_, fit = h.contexts.place(part, adapter, oai.contextNeed(r, n))
		}
		return nil, fit
	}
	toks = oai.truncate(toks)
	over, fit := h.contexts.place(part, adapter, oai.contextNeed(r, len(toks)))
	switch {
	case over:
		return nil, contextFit{}
	case lengthOnly:
		return nil, fit
	}
	return toks, fit
}

// onlyAdapter is adapter when req may go only to the workers serving it
// (a required taint: models.go, sglangfields.go), else "".
func onlyAdapter(req *selection.SelectRequest, adapter string) string {
	if c := req.Placement.RoutingConstraints; c != nil && len(c.RequiredTaints) > 0 {
		return adapter
	}
	return ""
}

// tokens finds the prompt's tokens: token_ids, an integer-array prompt on
// /v1/completions, SGLang's /generate prompt (generate.go), or the
// workers' /tokenize. Nil means none could be had, or that the engine
// will read no cache for the request the index can see (cacheread.go,
// sglangfields.go) and its length does not matter. lengthOnly says the
// tokens are for the request's length alone: no cache the index can see
// is read, so it is routed by load, but its model's workers have
// different contexts, and it may go only to those it fits
// (contextlimit.go).
func (h *Handler) tokens(r *http.Request, oai *openAIRequest, part selection.PartitionKey, adapter string) (toks []uint32, lengthOnly bool) {
	chat := isChat(r)
	if oai.embedsPrompt() {
		return nil, false // prompt embeddings: no length the gateway can count
	}
	// No worker's cache is read, or none the index can see (an SGLang
	// extra_key, a cap on what SGLang reads): route by load.
	lengthOnly = oai.skipsPrefixCache(chat) || oai.keyedApart() || isGenerate(r) && oai.capsCacheRead()
	if lengthOnly && !h.contexts.differ(part, adapter) {
		// Every worker takes it or refuses it alike: no /tokenize call
		// for a length that decides nothing.
		return nil, false
	}
	toks = h.promptTokens(r, oai, part)
	return toks, lengthOnly
}

// promptTokens are tokens' finding, from the body or a worker's
// /tokenize.
func (h *Handler) promptTokens(r *http.Request, oai *openAIRequest, part selection.PartitionKey) []uint32 {
	chat := isChat(r)
	switch {
	case isGenerate(r):
		text, ids, ok := oai.generatePrompt()
		switch {
		case !ok:
			return nil
		case ids != nil:
			return ids
		}
		oai.RawPrompt = text // tokenized as a completion's prompt, as SGLang encodes it
	case oai.TokenIDs != nil:
		return oai.TokenIDs
	case !chat && oai.promptTokens != nil:
		return oai.promptTokens
	case !chat && oai.RawPrompt.IsArray():
		if ids, ok := laxIDList(oai.RawPrompt); ok {
			return ids // token ids pydantic reads from floats, strings or booleans
		}
		text, ids, ok := promptOfOne(oai.RawPrompt, true)
		switch {
		case !ok:
			return nil // a batch of prompts: route by load
		case ids != nil:
			return ids
		}
		oai.RawPrompt = text // tokenized as the prompt alone
	}
	if h.tokenizer == nil {
		return nil
	}
	var toks []uint32
	var err error
	switch {
	case chat && len(oai.Messages) > 0:
		toks, err = h.tokenizer.tokenize(r.Context(), part, oai.CacheSalt, chatTokenizeBody(oai), oai.cuts())
	case oai.RawPrompt.IsString():
		toks, err = h.tokenizer.tokenize(r.Context(), part, oai.CacheSalt, completionTokenizeBody(oai), oai.cuts())
	default:
		return nil
	}
	if errors.Is(err, errPastContext) {
		// Routed by load, as a prompt of ids past every context is: the
		// engine refuses it (contextlimit.go).
		contextFiltered.WithLabelValues(modelLabels.of(part.Model), "over").Inc()
		return nil
	}
	if err != nil {
		tokenizeFailures.Inc()
		if c := h.logger.Check(zap.DebugLevel, "tokenize failed"); c != nil {
			c.Write(zap.Error(err))
		}
		return nil
	}
	return toks
}

// readAndRestore reads the whole body (413 past limit) and puts it back for
// the proxy: Body, ContentLength and GetBody, so retries can resend it,
// each reader counted by lease (bodylease.go). On failure it returns the
// status to answer.
func readAndRestore(r *http.Request, limit int64, buf []byte, lease *bodyLease) ([]byte, int, error) {
	if r.ContentLength > limit {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body of %d bytes is over the %d-byte limit", r.ContentLength, limit)
	}
	body, err := api.ReadBody(buf, r.Body, limit, r.ContentLength)
	_ = r.Body.Close()
	if err != nil {
		if errors.Is(err, api.ErrBodyTooLarge) {
			return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body is over the %d-byte limit", limit)
		}
		return nil, http.StatusBadRequest, err
	}
	r.Body = lease.reader(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return lease.reader(bytes.NewReader(body)), nil }
	return body, 0, nil
}

// readBody is readAndRestore within body_timeout: the connection's read
// deadline is set for the body and cleared once it is read (the server
// sets its own for the connection's next request).
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request, buf []byte, lease *bodyLease) ([]byte, int, error) {
	rc := http.NewResponseController(w)
	deadline := rc.SetReadDeadline(time.Now().Add(time.Duration(h.BodyTimeout))) == nil
	body, status, err := readAndRestore(r, h.MaxBodySize, buf, lease)
	if deadline {
		_ = rc.SetReadDeadline(time.Time{})
	}
	if errors.Is(err, api.ErrBodyTimeout) {
		w.Header().Set("Connection", "close")
		return nil, http.StatusRequestTimeout, fmt.Errorf("the request body did not arrive in time (body_timeout %v, or the server's own read timeout)", time.Duration(h.BodyTimeout))
	}
	return body, status, err
}

// defaultBodyTimeout is body_timeout's default: a 16 MiB body arrives in
// it at some 4.5 Mbit/s.
const defaultBodyTimeout = 30 * time.Second

// prefillWriter follows the worker's answer: its status tells the
// router's health whether the worker works (Reservation.Answered), its
// first body byte marks prefill complete (Reservation.PrefillDone) and
// the time to first token, and its last bytes are kept to read the
// engine's usage from (usage.go).
type prefillWriter struct {
	*caddyhttp.ResponseWriterWrapper
	res         *selection.Reservation
	arrived     time.Time // the request's arrival at the handler
	tail        *responseTail
	status      int
	wroteHeader bool
	firstByte   bool
	// overload and health mark a worker that answers "overloaded" busy
	// (overload_worker.go); prefilled, when set, runs at the first body
	// byte, when the worker's prefill capacity frees.
	overload  *overloadSettings
	health    *selection.Health
	prefilled func()
}

// tails pools the response tails, a fixed 8 KiB each.
var tails = sync.Pool{New: func() any { return &responseTail{buf: make([]byte, 0, usageTailSize)} }}

func newPrefillWriter(w http.ResponseWriter, res *selection.Reservation, arrived time.Time) *prefillWriter {
	t := tails.Get().(*responseTail)
	t.buf = t.buf[:0]
	return &prefillWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, res: res,
		arrived: arrived, tail: t}
}

// done returns the tail to its pool once the answer has been read.
func (w *prefillWriter) done() {
	tails.Put(w.tail)
	w.tail = nil
}

func (w *prefillWriter) WriteHeader(status int) {
	if !w.wroteHeader && status >= 200 {
		w.wroteHeader = true
		w.status = status
		report := status
		if busy, d := overloadedAnswer(status, w.Header()); busy && w.overload != nil {
			if resp := w.res.Response(); resp != nil {
				w.overload.markOverloaded(w.health, resp, d)
			}
			report = http.StatusTooManyRequests // busy, neither failed nor working
		}
		w.res.Answered(report)
	}
	w.ResponseWriterWrapper.WriteHeader(status)
}

func (w *prefillWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if len(b) > 0 {
		w.res.PrefillDone()
		if !w.firstByte {
			w.firstByte = true
			if w.prefilled != nil {
				w.prefilled()
			}
			if resp := w.res.Response(); resp != nil {
				ttftSeconds.WithLabelValues(modelLabels.of(resp.ModelName)).Observe(time.Since(w.arrived).Seconds())
			}
		}
		if w.tail != nil {
			w.tail.write(b)
		}
	}
	return w.ResponseWriterWrapper.Write(b)
}

// ReadFrom goes through Write, so the first byte is seen.
func (w *prefillWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(writerOnly{w}, r)
}

type writerOnly struct{ io.Writer }

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
	_ io.ReaderFrom               = (*prefillWriter)(nil)
)
