package caddymodule

import (
	"encoding/json"
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
	return f.ExtraKey.IsString() && string(f.ExtraKey) != `""`
}

// loraPath is the adapter lora_path names, or "" (absent, null, empty or
// not a string: SGLang's batch form, a list, is for /generate batches).
func (f *sglangFields) loraPath() string {
	if !f.LoraPath.IsString() {
		return ""
	}
	var s string
	if json.Unmarshal(f.LoraPath, &s) != nil {
		return ""
	}
	return s
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
	adapter := ""
	if !c.ServesModel(model) {
		base, name, ok := strings.Cut(model, ":")
		if !ok || name == "" || !c.ServesModel(base) {
			return ""
		}
		model, adapter = base, name
	} else {
		adapter = f.loraPath()
	}
	if adapter == "" {
		return ""
	}
	req.Partition.ModelName = model
	if base, ok := c.AdapterBase(adapter); ok && base == model {
		req.Placement.RoutingConstraints = &selection.RoutingConstraints{RequiredTaints: []string{selection.AdapterTaint(adapter)}}
	}
	return adapter
}
