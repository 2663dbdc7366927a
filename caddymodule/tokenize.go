package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// tokenizer asks a worker of the request's model for the tokens of a text
// prompt or chat messages, through vLLM's POST /tokenize. Every worker of a
// model shares its tokenizer, so any schedulable one will do; they take
// turns.
type tokenizer struct {
	workers *contextLimits // the workers to ask, made once a version of the model's
	timeout time.Duration  // for all of one request's tries
	client  *http.Client
	next    atomic.Uint64
	cache   *tokenCache // nil when off
	cooling tokenizerCooling
}

// newTokenizer asks r's workers, with connections of its own (kept for
// the next request, and closed with the handler: on Go's shared transport
// they outlived an unloaded config by its 90 s idle timeout), following no
// redirect: the endpoint is the one the catalog vetted, not wherever a
// worker points (a 307 re-sent the prompt anywhere, a cloud's metadata
// address included).
func newTokenizer(r *selection.Router, timeout time.Duration, cacheTokens int) *tokenizer {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxResponseHeaderBytes = maxTokenizeHeader
	client := &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return &tokenizer{workers: newContextLimits(r.Catalog()), timeout: timeout, client: client, cache: newTokenCache(cacheTokens)}
}

// maxTokenizeHeader bounds a /tokenize answer's header (Go's default is
// 10 MB): vLLM's is a few hundred bytes.
const maxTokenizeHeader = 64 << 10

// close lets the tokenizer's idle connections go (one still in use keeps
// to the idle timeout once its request ends).
func (t *tokenizer) close() {
	if t != nil {
		t.client.CloseIdleConnections()
	}
}

// tokenizeResponse is the part of vLLM's /tokenize answer we read.
type tokenizeResponse struct {
	Tokens selection.TokenList `json:"tokens"`
}

// maxTokenizeTries bounds the workers one request's tokens are asked of.
const maxTokenizeTries = 3

// tokenize asks a worker of part for the tokens of body (a /tokenize
// request, tokenize_body.go). A worker that cannot be reached or answers
// 5xx is not the model's only tokenizer: the next one is asked, up to
// maxTokenizeTries, all within the one tokenize_timeout. A 4xx is the
// request's own fault and would be the same anywhere. salt is the
// request's cache_salt: answers are kept per salt, so that a tenant's
// conversation is never answered faster for another tenant having sent
// it (a timing oracle cache_salt exists to close). cut says the request
// cuts its prompt (truncate_prompt_tokens), which /tokenize does not: its
// answer is read whole, whatever the workers' contexts, for the cut to be
// made of it.
func (t *tokenizer) tokenize(ctx context.Context, part selection.PartitionKey, salt string, body []byte, cut bool) ([]uint32, error) {
	key := tokenCacheKey(part.Model+"\x00"+part.Group+"\x00"+salt, body)
	if toks := t.cache.get(key); toks != nil {
		return toks, nil
	}
	toks, err := t.askWorkers(ctx, part, body, cut)
	if err == nil {
		t.cache.put(key, toks)
	}
	return toks, err
}

// askWorkers asks up to maxTokenizeTries workers of part in turn.
func (t *tokenizer) askWorkers(ctx context.Context, part selection.PartitionKey, body []byte, cut bool) ([]uint32, error) {
	// The workers serving the request's adapter, when it has one: only
	// they can tokenize for it. The longest of their contexts bounds the
	// answer (0: none): a prompt longer than a shorter worker's context
	// still fits a longer one, or one whose context is unknown, which the
	// context filter then sends it to (contextlimit.go).
	pc := t.workers.of(part, tokenizeAdapter(ctx))
	endpoints, maxLen := pc.tokenizers, pc.tokenizeLimit
	if cut {
		maxLen = 0
	}
	if len(endpoints) == 0 {
		return nil, errors.New("no worker to tokenize with")
	}
	client := ctx
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	var order [maxTokenizeTries]string
	tries := t.cooling.order(endpoints, t.next.Add(1), order[:0], time.Now())
	var err error
	for _, ep := range tries {
		var toks []uint32
		var retry bool
		toks, retry, err = t.ask(ctx, ep, body, maxLen)
		if err != nil && retry && client.Err() == nil {
			t.cooling.add(ep, time.Now())
		}
		if err == nil || !retry || ctx.Err() != nil {
			return toks, err
		}
	}
	return nil, err
}

// ask sends body to one worker's /tokenize; retry says whether another
// worker could answer better. A prompt longer than maxLen tokens (the
// longest context of the model's workers, 0 when unknown) is an error:
// every engine will refuse it, and its answer is not read past what
// maxLen tokens take (a probe's 4 MiB text came back as 12 MB of token
// ids).
func (t *tokenizer) ask(ctx context.Context, endpoint string, body []byte, maxLen uint64) ([]uint32, bool, error) {
	if !strings.Contains(endpoint, "://") {
		endpoint = "http://" + endpoint
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(endpoint, "/")+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return nil, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	// A worker whose endpoint is this gateway answers 508 at once, where
	// the call came back as a request to tokenize, which called again.
	req.Header.Set(viaHeader, processID)
	res, err := t.client.Do(req)
	if err != nil {
		return nil, true, err
	}
	defer res.Body.Close()
	// Bounded by the prompt as well as by the contexts: a worker that
	// reports no context (or one that lies) otherwise had the 64 MiB
	// bound read for any prompt, and answering each text request with
	// 64 MiB of ids took the gateway to 3 GB.
	limit := min(int64(maxTokenizeAnswer), promptTokensAtMost(body)*tokenAnswerBytes+tokenAnswerSlack)
	contextLimit := int64(-1) // the context's bound, when it is the tighter
	if maxLen > 0 {
		// maxLen is at most selection.MaxContextTokens (the catalog's
		// bound on max_model_len): the product cannot overflow.
		if c := int64(maxLen)*tokenAnswerBytes + tokenAnswerSlack; c < limit {
			limit, contextLimit = c, c
		}
	}
	b, err := io.ReadAll(io.LimitReader(res.Body, limit+1))
	if err != nil {
		return nil, true, err
	}
	if res.StatusCode != http.StatusOK {
		return nil, res.StatusCode >= 500, fmt.Errorf("tokenize: status %d", res.StatusCode)
	}
	if int64(len(b)) > limit {
		if limit == contextLimit {
			return nil, false, fmt.Errorf("%w: an answer of more than %d bytes", errPastContext, limit)
		}
		return nil, false, fmt.Errorf("tokenize: an answer of more than %d bytes, past what the prompt can make", limit)
	}
	var out tokenizeResponse
	if err := selection.UnmarshalPlain(b, &out); err != nil {
		return nil, false, fmt.Errorf("tokenize: %v", err)
	}
	if out.Tokens == nil {
		return nil, false, errors.New("tokenize: no tokens in the answer")
	}
	if maxLen > 0 && uint64(len(out.Tokens)) > maxLen {
		return nil, false, fmt.Errorf("%w: %d tokens, past the model's %d", errPastContext, len(out.Tokens), maxLen)
	}
	return out.Tokens, false, nil
}

// errPastContext is a prompt longer than every worker's context: no
// engine will serve it, and the context filter counts it as over.
var errPastContext = errors.New("tokenize: a prompt past every worker's context")

// Bounds of a /tokenize answer: at most maxTokenizeAnswer bytes, and
// tokenAnswerBytes a token (ten digits, a comma and a space) and
// tokenAnswerSlack for the rest, for at most the model's context length
// (when known) and at most promptTokensAtMost(the request).
const (
	maxTokenizeAnswer = 64 << 20
	tokenAnswerBytes  = 12
	tokenAnswerSlack  = 64 << 10
	templateTokens    = 1 << 18
)

// mediaMention is a key naming a chat content part that vLLM's multimodal
// processor turns into many tokens, and the tokens each mention may add:
// a part names its type twice ({"type":"image_url","image_url":...}), so
// an image may have 2^16 (a Qwen2.5-VL image has 16,384 at most), a video
// or an audio 2^18 (frames and windows: no fixed ceiling).
type mediaMention struct {
	key    []byte
	tokens int64
}

var mediaMentions = []mediaMention{
	{[]byte(`"image_url"`), 1 << 15}, {[]byte(`"input_image"`), 1 << 15}, {[]byte(`"image_pil"`), 1 << 15},
	{[]byte(`"image_embeds"`), 1 << 15}, {[]byte(`"video_url"`), 1 << 17}, {[]byte(`"input_audio"`), 1 << 17},
	{[]byte(`"audio_url"`), 1 << 17}, {[]byte(`"audio_embeds"`), 1 << 17},
}

// messagesKey marks a chat body: only chat messages carry media parts.
var messagesKey = []byte(`"messages"`)

// promptTokensAtMost is the most tokens an engine's honest /tokenize
// answer to body holds: a token a byte (no tokenizer makes more of a
// text: byte-level BPE and byte fallback end at a token a byte), the chat
// template's own text (templateTokens), and, in a chat body, the tokens
// of each mention of a media part. Since vLLM 0.17 /tokenize expands each
// item into its tokens: a Qwen2.5-VL image up to 16,384 of them, named by
// a URL of some 60 bytes, and 29 such images passed the bound without the
// media's share. Counted by mention, not parsed: a mention in text only
// loosens the bound, within maxTokenizeAnswer.
func promptTokensAtMost(body []byte) int64 {
	n := int64(len(body) + templateTokens)
	if !bytes.Contains(body, messagesKey) {
		return n
	}
	for _, m := range mediaMentions {
		n += int64(bytes.Count(body, m.key)) * m.tokens
	}
	return n
}

// quoteJSON writes s as a JSON string.
func quoteJSON(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
