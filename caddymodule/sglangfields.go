package caddymodule

import (
	"strings"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// sglangFields are SGLang's own ways for a request to pick the cache
// namespace its prefix is kept under (docs/sglang.md, "LoRA adapters and
// cache namespaces"); vLLM ignores both members.
//
//   - lora_path names a LoRA adapter the worker loaded, with the base model
//     in model. (SGLang also takes "<base>:<adapter>" in model; that form
//     is read by sglangAdapter from the model itself.)
//   - extra_key keys the request's blocks apart from every other
//     request's. SGLang's KV events do not say which blocks a key holds,
//     so the index holds them as plain blocks: no prediction for such a
//     request can be right, and it is routed by load.
type sglangFields struct {
	LoraPath selection.RawJSON `json:"lora_path"`
	ExtraKey selection.RawJSON `json:"extra_key"`
}

// keyedApart reports whether the request names an SGLang extra_key, a
// cache namespace the gateway cannot see.
func (f *sglangFields) keyedApart() bool {
	k, _ := onlyItem(f.ExtraKey).Text()
	return k != ""
}

// loraPath is the adapter lora_path names, or "" (absent, null, empty or
// not a string).
func (f *sglangFields) loraPath() string {
	s, _ := onlyItem(f.LoraPath).Text()
	return s
}

// onlyItem is the element of a one-element list, else v itself. SGLang
// reads a batch's per-item members as lists, one item each; a batch of
// one is routed as its element (batchofone.go), so its members are read
// as the element's.
func onlyItem(v selection.RawJSON) selection.RawJSON {
	if item, ok := soleElement(v); ok {
		return item
	}
	return v
}

// sglangAdapter resolves SGLang's adapter forms for a request whose model
// is not itself an adapter (routeAdapter): a model "<base>:<adapter>"
// whose base the catalog serves, or the base model with lora_path. It
// turns req into a request for the base model and returns the adapter's
// name ("" when neither form is used). When the catalog knows which
// workers serve the adapter, only they may take the request; an adapter
// it does not know (an engine that does not list its adapters) leaves
// every worker of the base model a candidate. Either way the prompt is
// hashed with the adapter's name, as the engine names the adapter's
// blocks in its events.
func sglangAdapter(c *selection.Catalog, req *selection.SelectRequest, f *sglangFields) string {
	model := req.Partition.ModelName
	base, name, colon := strings.Cut(model, ":")
	adapter := f.loraPath()
	if !colon && adapter == "" {
		return "" // neither form: the catalog is not asked (every request comes here)
	}
	if !c.ServesModel(model) {
		// SGLang splits at the first colon and trims both parts; an empty
		// adapter is the base model alone.
		base, name = strings.TrimSpace(base), strings.TrimSpace(name)
		if !colon || !c.ServesModel(base) {
			return ""
		}
		model, adapter = base, name
		req.Partition.ModelName = model
	}
	if adapter == "" {
		return ""
	}
	if base, ok := c.AdapterBase(adapter); ok && base == model {
		req.Placement.RoutingConstraints = &selection.RoutingConstraints{RequiredTaints: []string{selection.AdapterTaint(adapter)}}
	}
	return adapter
}
