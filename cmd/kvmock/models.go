package main

import (
	"net/http"
	"strconv"

	json "github.com/goccy/go-json"
)

// GET /v1/models in vLLM's shape: one card for the served model and one
// per LoRA adapter this worker loaded, whose parent is the base model and
// whose root is the adapter's path, as vLLM lists them.

// modelCard is one entry of the list.
type modelCard struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// Root is the model's path: the base model's name here (kvmock loads
	// nothing from disk), an adapter's --lora-modules path.
	Root string `json:"root"`
	// Parent is nil for the base model and its name for an adapter.
	Parent *string `json:"parent"`
	// MaxModelLen is set on the base model's card only, as in vLLM.
	MaxModelLen *int              `json:"max_model_len"`
	Permission  []modelPermission `json:"permission"`
}

// modelPermission is the permission object vLLM attaches to each card,
// with its fixed values.
type modelPermission struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Created            int64   `json:"created"`
	AllowCreateEngine  bool    `json:"allow_create_engine"`
	AllowSampling      bool    `json:"allow_sampling"`
	AllowLogprobs      bool    `json:"allow_logprobs"`
	AllowSearchIndices bool    `json:"allow_search_indices"`
	AllowView          bool    `json:"allow_view"`
	AllowFineTuning    bool    `json:"allow_fine_tuning"`
	Organization       string  `json:"organization"`
	Group              *string `json:"group"`
	IsBlocking         bool    `json:"is_blocking"`
}

// card returns the card of id with the worker's start as its time.
func (w *worker) card(id, root string, parent *string, maxLen *int) modelCard {
	created := w.started.Unix()
	return modelCard{
		ID: id, Object: "model", Created: created, OwnedBy: "vllm", Root: root, Parent: parent, MaxModelLen: maxLen,
		Permission: []modelPermission{{
			ID:     "modelperm-" + strconv.Itoa(w.id) + "-" + id,
			Object: "model_permission", Created: created,
			AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*",
		}},
	}
}

// handleModels serves GET /v1/models.
func (w *worker) handleModels(rw http.ResponseWriter, _ *http.Request) {
	maxLen := w.cfg.contextOf(w.id)
	cards := []modelCard{w.card(w.cfg.Model, w.cfg.Model, nil, &maxLen)}
	// In the order --lora-modules gave them, as vLLM lists its adapters.
	for _, a := range w.cfg.LoraModules {
		if _, ok := w.adapters[a.Name]; ok {
			parent := w.cfg.Model
			cards = append(cards, w.card(a.Name, a.Path, &parent, nil))
		}
	}
	b, _ := json.Marshal(map[string]any{"object": "list", "data": cards})
	rw.Header().Set("Content-Type", "application/json")
	_, _ = rw.Write(b)
}
