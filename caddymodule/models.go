package caddymodule

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// The OpenAI surface the gateway owns (docs/engine-facts.md): the model
// list, and requests that name a LoRA adapter as their model.

// modelCard is one model in GET /v1/models, in vLLM's shape (OpenAI's
// model object with vLLM's root, parent and max_model_len).
type modelCard struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// Root is the model the card's model derives from: its own name for
	// a base model, its base model for an adapter (the gateway does not
	// know the weights' paths vLLM puts here).
	Root string `json:"root"`
	// Parent is an adapter's base model; null for a base model.
	Parent *string `json:"parent"`
	// MaxModelLen is the context length, null when no worker reported it.
	MaxModelLen *uint64    `json:"max_model_len"`
	Permission  []struct{} `json:"permission"`
}

type modelCardList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

// serveModels answers GET /v1/models from the catalog: every model its
// schedulable workers serve, once, whichever worker is asked, where a
// worker would list only its own (selection.Catalog.ServedModels).
func (h *Handler) serveModels(w http.ResponseWriter) error {
	now := time.Now().Unix()
	models := h.router.Catalog().ServedModels()
	list := modelCardList{Object: "list", Data: make([]modelCard, len(models))}
	for i, m := range models {
		card := modelCard{ID: m.ID, Object: "model", Created: now, OwnedBy: "kvrouter", Root: m.ID, Permission: []struct{}{}}
		if m.Parent != "" {
			card.Parent, card.Root = &m.Parent, m.Parent
		}
		if m.MaxModelLen > 0 {
			card.MaxModelLen = &m.MaxModelLen
		}
		list.Data[i] = card
	}
	b, err := json.Marshal(list)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, err = w.Write(b)
	return err
}

// routeAdapter turns a request whose model is a LoRA adapter into one for
// the adapter's base model that only the workers serving the adapter may
// take, and returns the adapter's name ("" for any other model). The body
// is not changed: its model still names the adapter, which is how the
// engine picks it.
func routeAdapter(c *selection.Catalog, req *selection.SelectRequest) string {
	adapter := req.Partition.ModelName
	base, ok := c.AdapterBase(adapter)
	if !ok {
		return ""
	}
	req.Partition.ModelName = base
	req.Placement.RoutingConstraints = &selection.RoutingConstraints{RequiredTaints: []string{selection.AdapterTaint(adapter)}}
	return adapter
}

// tokenizeAdapterKey carries, in a request's context, the LoRA adapter
// its /tokenize call is for: only a worker serving the adapter can
// tokenize for it (another answers 404).
type tokenizeAdapterKey struct{}

// withTokenizeAdapter is ctx for a /tokenize call on behalf of adapter.
func withTokenizeAdapter(ctx context.Context, adapter string) context.Context {
	return context.WithValue(ctx, tokenizeAdapterKey{}, adapter)
}

// tokenizeAdapter is the adapter a /tokenize call is for, or "".
func tokenizeAdapter(ctx context.Context) string {
	a, _ := ctx.Value(tokenizeAdapterKey{}).(string)
	return a
}

// servesAdapter reports whether w can take, and tokenize, a request for
// adapter ("": the base model, which every worker of the partition
// serves).
func servesAdapter(w *selection.WorkerRecord, adapter string) bool {
	return adapter == "" || w.ServesAdapter(adapter)
}
