package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	json "github.com/goccy/go-json"
)

// registration is the body of the selection API's POST /workers for one
// worker (docs/selection-api.md, "Workers").
type registration struct {
	WorkerID            int               `json:"worker_id"`
	ModelName           string            `json:"model_name"`
	Endpoint            string            `json:"endpoint"`
	KVEventsEndpoint    string            `json:"kv_events_endpoint,omitempty"`
	KVEventsEndpoints   map[string]string `json:"kv_events_endpoints,omitempty"`
	ReplayEndpoint      string            `json:"replay_endpoint,omitempty"`
	BlockSize           int               `json:"block_size"`
	TotalKVBlocks       int               `json:"total_kv_blocks"`
	MaxNumBatchedTokens int               `json:"max_num_batched_tokens"`
	DataParallelSize    int               `json:"data_parallel_size,omitempty"`
	// LoraAdapters are the adapters the worker loaded: the gateway sends
	// a request naming one only to workers that serve it.
	LoraAdapters []string `json:"lora_adapters,omitempty"`
	// MaxModelLen is the engine's context length, as /v1/models says it.
	MaxModelLen int `json:"max_model_len,omitempty"`
}

// registration describes the worker to the gateway. With several DP ranks
// it lists one event endpoint per rank and no replay endpoint, because the
// selection API takes a single replay endpoint per worker.
func (w *worker) registration() registration {
	reg := registration{
		WorkerID:            w.id,
		ModelName:           w.cfg.Model,
		Endpoint:            w.addr,
		BlockSize:           w.cfg.BlockSize,
		TotalKVBlocks:       w.cfg.KVBlocks,
		MaxNumBatchedTokens: w.cfg.MaxBatchedTokens,
		MaxModelLen:         w.cfg.contextOf(w.id),
	}
	// In --lora-modules order, as /v1/models lists them.
	for _, a := range w.cfg.LoraModules {
		if _, ok := w.adapters[a.Name]; ok {
			reg.LoraAdapters = append(reg.LoraAdapters, a.Name)
		}
	}
	if len(w.engines) == 1 {
		reg.KVEventsEndpoint = w.engines[0].pub.PubEndpoint
		reg.ReplayEndpoint = w.engines[0].pub.ReplayEndpoint
		return reg
	}
	reg.DataParallelSize = len(w.engines)
	reg.KVEventsEndpoints = make(map[string]string, len(w.engines))
	for _, e := range w.engines {
		reg.KVEventsEndpoints[strconv.Itoa(e.dpRank)] = e.pub.PubEndpoint
	}
	return reg
}

// Register announces every worker to the selection API at base (its URL
// without "/workers"). The gateway is often started at the same time as the
// fleet, so connection failures, 404 and 5xx answers are retried until ctx
// ends; any other non-2xx answer is an error at once. A non-empty token is
// sent as the bearer token that a gateway's write_token asks for.
func (f *Fleet) Register(ctx context.Context, base, token string) error {
	client := &http.Client{Timeout: 2 * time.Second}
	url := base + "/workers"
	for _, w := range f.workers {
		body, err := json.Marshal(w.registration())
		if err != nil {
			return err
		}
		for {
			err := post(ctx, client, url, token, body)
			if err == nil {
				break
			}
			if _, permanent := err.(*statusError); permanent {
				return fmt.Errorf("registering worker %d: %w", w.id, err)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("registering worker %d: %w (last error: %v)", w.id, ctx.Err(), err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

// statusError is an answer that retrying will not change (a 4xx but 404).
type statusError struct {
	status int
	body   string
}

// Error describes the answer.
func (e *statusError) Error() string { return fmt.Sprintf("status %d: %s", e.status, e.body) }

// post sends one registration; see Register for which errors are final.
func post(ctx context.Context, client *http.Client, url, token string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return &statusError{status: 0, body: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
	switch {
	case res.StatusCode/100 == 2:
		return nil
	case res.StatusCode >= 500 || res.StatusCode == http.StatusNotFound:
		// A gateway that is still loading its config may not route the
		// selection API yet.
		return fmt.Errorf("status %d: %s", res.StatusCode, bytes.TrimSpace(msg))
	}
	return &statusError{status: res.StatusCode, body: string(bytes.TrimSpace(msg))}
}
