package caddymodule

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// Reading one engine's facts (docs/engine-facts.md) from the two
// endpoints every vLLM server has: GET /v1/models (the served model, its
// max_model_len, and a card per LoRA adapter whose parent is the base
// model) and GET /metrics (the vllm:cache_config_info gauge, whose labels
// carry the cache configuration). An engine that has only one of them
// (SGLang has no vllm:cache_config_info) gives what that one says.

// The bounds of one reading: an engine's answer is read no further than
// these, whatever it sends.
const (
	// maxModelsBytes bounds a /v1/models answer: a card is a few hundred
	// bytes, so 1 MiB holds thousands of adapters.
	maxModelsBytes = 1 << 20
	// maxMetricsBytes bounds how much of /metrics is scanned for the
	// cache gauge; vLLM's whole exposition is a few hundred KiB.
	maxMetricsBytes = 8 << 20
	// maxMetricsLine bounds one line of /metrics.
	maxMetricsLine = 64 << 10
)

// cacheConfigMetric is vLLM's info gauge of the KV cache configuration.
const cacheConfigMetric = "vllm:cache_config_info"

// engineProbe reads engines over HTTP, each call bounded by timeout.
type engineProbe struct {
	client  *http.Client
	timeout time.Duration
}

// newEngineProbe makes a probe with its own connections, none kept
// between readings (one every interval per worker is not worth an idle
// connection, and a test that waits for a worker's connections to close
// must not wait for ours), that follows no redirect: the endpoint is the
// one the catalog vetted, not wherever it points.
func newEngineProbe(timeout time.Duration) *engineProbe {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true
	return &engineProbe{timeout: timeout, client: &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// engineReading is what one reading learned: the facts, and what it
// could not learn or had to leave out.
type engineReading struct {
	facts selection.EngineFacts
	// errs are the calls that failed; a reading with two failed calls
	// learned nothing.
	errs []error
	// notes are what an answer held that the catalog cannot take (an
	// adapter name past its bound, adapters past MaxLoraAdapters).
	notes []string
}

// read asks endpoint's engine for its models and its cache configuration.
func (p *engineProbe) read(ctx context.Context, endpoint string) engineReading {
	var r engineReading
	if err := p.readModels(ctx, endpoint, &r); err != nil {
		r.errs = append(r.errs, err)
	}
	if err := p.readCacheConfig(ctx, endpoint, &r); err != nil {
		r.errs = append(r.errs, err)
	}
	return r
}

// failed reports whether the reading learned nothing.
func (r *engineReading) failed() bool { return len(r.errs) == 2 }

// get fetches path from endpoint's engine and hands its 200 answer's body
// to fn, within the probe's timeout.
func (p *engineProbe) get(ctx context.Context, endpoint, path string, fn func(io.Reader) error) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	if !strings.Contains(endpoint, "://") {
		endpoint = "http://" + endpoint
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(endpoint, "/")+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set(viaHeader, processID) // a worker that is this gateway answers 508 (loop.go)
	res, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: status %d", path, res.StatusCode)
	}
	if err := fn(res.Body); err != nil {
		return fmt.Errorf("GET %s: %v", path, err)
	}
	return nil
}

// modelList is the part of vLLM's /v1/models answer read here: the model
// cards, a LoRA adapter's with its base model as parent.
type modelList struct {
	Data []struct {
		ID          string  `json:"id"`
		Parent      *string `json:"parent"`
		MaxModelLen *uint64 `json:"max_model_len"`
	} `json:"data"`
}

// readModels reads the served models, the context length and the
// adapters from /v1/models into r.
func (p *engineProbe) readModels(ctx context.Context, endpoint string, r *engineReading) error {
	return p.get(ctx, endpoint, "/v1/models", func(body io.Reader) error {
		b, err := io.ReadAll(io.LimitReader(body, maxModelsBytes+1))
		if err != nil {
			return err
		}
		if len(b) > maxModelsBytes {
			return fmt.Errorf("the answer is over %d bytes", maxModelsBytes)
		}
		var list modelList
		if err := json.Unmarshal(b, &list); err != nil {
			return err
		}
		adapters := []string{} // an answer without adapters says there are none
		for _, card := range list.Data {
			switch {
			case card.ID == "":
				continue
			case len(card.ID) > selection.MaxFieldBytes:
				r.notes = append(r.notes, fmt.Sprintf("a model name of %d bytes, more than %d, left out", len(card.ID), selection.MaxFieldBytes))
			case card.Parent != nil && *card.Parent != "" && *card.Parent != card.ID:
				adapters = append(adapters, card.ID)
			default:
				r.facts.Models = append(r.facts.Models, card.ID)
				switch {
				case card.MaxModelLen == nil || r.facts.MaxModelLen != 0:
				case *card.MaxModelLen > selection.MaxContextTokens:
					r.notes = append(r.notes, fmt.Sprintf("max_model_len %d, more than %d, left out", *card.MaxModelLen, selection.MaxContextTokens))
				default:
					r.facts.MaxModelLen = *card.MaxModelLen
				}
			}
		}
		if len(adapters) > selection.MaxLoraAdapters {
			r.notes = append(r.notes, fmt.Sprintf("%d LoRA adapters, more than %d: the rest left out", len(adapters), selection.MaxLoraAdapters))
			adapters = adapters[:selection.MaxLoraAdapters]
		}
		r.facts.LoraAdapters = adapters
		return nil
	})
}

// readCacheConfig reads the block size and the device's KV blocks from
// the labels of vllm:cache_config_info in /metrics into r.
func (p *engineProbe) readCacheConfig(ctx context.Context, endpoint string, r *engineReading) error {
	return p.get(ctx, endpoint, "/metrics", func(body io.Reader) error {
		labels, err := findSample(io.LimitReader(body, maxMetricsBytes), cacheConfigMetric)
		if err != nil {
			return err
		}
		bs, err := strconv.ParseUint(labels["block_size"], 10, 32)
		if err != nil || bs == 0 {
			return fmt.Errorf("%s has no block_size label (%q)", cacheConfigMetric, labels["block_size"])
		}
		r.facts.BlockSize = uint32(bs)
		// num_gpu_blocks reads "None" until the engine has sized its cache.
		if n, err := strconv.ParseUint(labels["num_gpu_blocks"], 10, 64); err == nil {
			if n > selection.MaxKVBlocks {
				r.notes = append(r.notes, fmt.Sprintf("num_gpu_blocks %d, more than %d, left out", n, uint64(selection.MaxKVBlocks)))
			} else {
				r.facts.TotalKVBlocks = n
			}
		}
		// Python's bool, as vLLM writes its config into the labels.
		switch labels["enable_prefix_caching"] {
		case "True", "true":
			on := true
			r.facts.PrefixCaching = &on
		case "False", "false":
			off := false
			r.facts.PrefixCaching = &off
		}
		return nil
	})
}

// findSample scans a Prometheus text exposition for the first sample of
// metric and returns its labels.
func findSample(body io.Reader, metric string) (map[string]string, error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 4096), maxMetricsLine)
	prefix := []byte(metric + "{")
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, prefix) {
			continue
		}
		return parseLabels(string(line[len(prefix):]))
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("no %s sample", metric)
}

// parseLabels parses the label set of a sample line, from after its "{":
// name="value" pairs, comma-separated, values with the text format's
// escapes (\\, \" and \n), up to the closing brace.
func parseLabels(s string) (map[string]string, error) {
	labels := map[string]string{}
	for {
		s = strings.TrimLeft(s, " ,")
		if strings.HasPrefix(s, "}") {
			return labels, nil
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || len(s) < eq+2 || s[eq+1] != '"' {
			return nil, errors.New("malformed label set")
		}
		name := strings.TrimSpace(s[:eq])
		var v strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				if s[i] == 'n' {
					v.WriteByte('\n')
					continue
				}
			}
			v.WriteByte(s[i])
		}
		if i == len(s) {
			return nil, errors.New("unterminated label value")
		}
		labels[name] = v.String()
		s = s[i+1:]
	}
}
