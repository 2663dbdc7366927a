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
	router *selection.Router
	client *http.Client
	next   atomic.Uint64
}

func newTokenizer(r *selection.Router, timeout time.Duration) *tokenizer {
	return &tokenizer{router: r, client: &http.Client{Timeout: timeout}}
}

// tokenizeResponse is the part of vLLM's /tokenize answer we read.
type tokenizeResponse struct {
	Tokens selection.TokenList `json:"tokens"`
}

// tokenize sends {"model": model, field: raw} to a worker of part.
func (t *tokenizer) tokenize(ctx context.Context, part selection.PartitionKey, model, field string, raw []byte) ([]uint32, error) {
	var endpoints []string
	for _, w := range t.router.Catalog().ListWorkers(part.Model, part.Group) {
		if w.Schedulable() && w.Endpoint != nil {
			endpoints = append(endpoints, *w.Endpoint)
		}
	}
	if len(endpoints) == 0 {
		return nil, errors.New("no worker to tokenize with")
	}
	ep := endpoints[t.next.Add(1)%uint64(len(endpoints))]
	if !strings.Contains(ep, "://") {
		ep = "http://" + ep
	}
	var body bytes.Buffer
	body.WriteString(`{"model":`)
	body.WriteString(quoteJSON(model))
	body.WriteString(`,"` + field + `":`)
	body.Write(raw)
	body.WriteString(`,"add_special_tokens":true}`)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(ep, "/")+"/tokenize", &body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := t.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("tokenize: status %d", res.StatusCode)
	}
	var out tokenizeResponse
	if err := selection.UnmarshalPlain(b, &out); err != nil {
		return nil, fmt.Errorf("tokenize: %v", err)
	}
	if out.Tokens == nil {
		return nil, errors.New("tokenize: no tokens in the answer")
	}
	return out.Tokens, nil
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
