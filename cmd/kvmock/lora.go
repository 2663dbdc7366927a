package main

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// LoRA adapters as vLLM serves them: each has a name, which requests give
// as their model, and a path. A worker serves the base model and the
// adapters it loaded; a request for an adapter it did not load is vLLM's
// 404. An adapter's KV blocks are its own: their hashes are salted by the
// adapter's name (blockhash.go), so they never match another adapter's or
// the base model's, and the BlockStored events carry the name as
// lora_name so that a gateway can salt its own hashes the same way.

// LoraModule is one adapter, as vLLM's --lora-modules name=path gives it.
type LoraModule struct {
	// Name is what a request's model field names the adapter by.
	Name string
	// Path is where the adapter was loaded from; /v1/models shows it as
	// the card's root.
	Path string
}

// parseLoraModules reads --lora-modules: name=path pairs, separated by
// commas or white space (vLLM takes them as separate arguments).
func parseLoraModules(s string) ([]LoraModule, error) {
	var out []LoraModule
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' }) {
		name, path, ok := strings.Cut(f, "=")
		if !ok || name == "" || path == "" {
			return nil, fmt.Errorf("--lora-modules wants name=path, not %q", f)
		}
		out = append(out, LoraModule{Name: name, Path: path})
	}
	return out, nil
}

// parseWorkerIDs reads --lora-workers: worker ids separated by commas.
func parseWorkerIDs(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		id, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("--lora-workers wants worker ids, not %q", f)
		}
		out = append(out, id)
	}
	return out, nil
}

// validateLora checks the adapters' names and the workers that load them.
func (c *Config) validateLora() error {
	seen := map[string]bool{c.Model: true}
	for _, m := range c.LoraModules {
		if seen[m.Name] {
			return fmt.Errorf("--lora-modules: the name %q is taken (by the model or another adapter)", m.Name)
		}
		seen[m.Name] = true
	}
	for _, id := range c.LoraWorkers {
		if id < 1 || id > c.Workers {
			return fmt.Errorf("--lora-workers: no worker %d (ids are 1..%d)", id, c.Workers)
		}
	}
	return nil
}

// adaptersFor returns the adapters worker id loads, by name.
func (c *Config) adaptersFor(id int) map[string]LoraModule {
	if len(c.LoraModules) == 0 || len(c.LoraWorkers) > 0 && !slices.Contains(c.LoraWorkers, id) {
		return nil
	}
	m := make(map[string]LoraModule, len(c.LoraModules))
	for _, a := range c.LoraModules {
		m[a.Name] = a
	}
	return m
}

// resolveModel maps a request's model to the adapter that serves it: ""
// for the base model (also when the request names none, as vLLM
// accepts), the adapter's name when this worker loaded it, and vLLM's 404
// for anything else.
func (w *worker) resolveModel(model string) (string, error) {
	if model == "" || model == w.cfg.Model {
		return "", nil
	}
	if _, ok := w.adapters[model]; ok {
		return model, nil
	}
	return "", &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("The model `%s` does not exist.", model), param: "model"}
}
