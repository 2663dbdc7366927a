package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// The policies a run can compare, by name; --router-config adds kv_router
// variants under names of their own.
var builtinPolicies = []string{"kv_router", "kv_router_dynamo", "round_robin", "least_loaded", "random", "oracle", "first_block"}

// defaultPolicies are the ones a run compares unless told otherwise:
// first_block is left out, since with a system prompt every session
// shares it sends the whole fleet's work to one worker.
var defaultPolicies = builtinPolicies[:len(builtinPolicies)-1]

// ourRouterConfig is the gateway's router with its defaults.
func ourRouterConfig() selection.Config { return selection.GatewayConfig() }

// routerOverrides is a --router-config variant: the cost knobs by their
// Caddyfile names, applied over our configuration (or Dynamo's with
// "base": "dynamo"). Unknown fields are refused, so a typo is not a
// silent no-op.
type routerOverrides struct {
	Base                      string   `json:"base"`
	OverlapScoreCredit        *float64 `json:"overlap_score_credit"`
	OverlapScoreCreditDecay   *float64 `json:"overlap_score_credit_decay"`
	PrefillLoadScale          *float64 `json:"prefill_load_scale"`
	DecodeActiveRequestWeight *float64 `json:"decode_active_request_weight"`
	SharedCacheMultiplier     *float64 `json:"shared_cache_multiplier"`
	RouterTemperature         *float64 `json:"router_temperature"`
	AssumeKVReuse             *bool    `json:"assume_kv_reuse"`
	TrackActiveBlocks         *bool    `json:"track_active_blocks"`
	TrackPrefillTokens        *bool    `json:"track_prefill_tokens"`
	InFlightOverlap           *bool    `json:"in_flight_overlap"`
	UnclippedOverlapCredit    *bool    `json:"unclipped_overlap_credit"`
}

// variant is a named kv_router configuration.
type variant struct {
	name string
	cfg  selection.Config
}

// parseVariant reads NAME=JSON.
func parseVariant(s string) (variant, error) {
	name, js, ok := strings.Cut(s, "=")
	if !ok || name == "" || strings.ContainsAny(name, " ,") {
		return variant{}, fmt.Errorf("--router-config %q: want NAME={json}", s)
	}
	for _, b := range builtinPolicies {
		if name == b {
			return variant{}, fmt.Errorf("--router-config: %s is a built-in policy's name", name)
		}
	}
	var o routerOverrides
	dec := json.NewDecoder(bytes.NewReader([]byte(js)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		return variant{}, fmt.Errorf("--router-config %s: %w", name, err)
	}
	cfg := ourRouterConfig()
	switch o.Base {
	case "", "ours":
	case "dynamo":
		cfg = selection.DefaultConfig()
	default:
		return variant{}, fmt.Errorf("--router-config %s: base %q is not ours or dynamo", name, o.Base)
	}
	for _, f := range []struct {
		v   *float64
		dst *float64
	}{
		{o.OverlapScoreCredit, &cfg.OverlapScoreCredit},
		{o.OverlapScoreCreditDecay, &cfg.OverlapScoreCreditDecay},
		{o.PrefillLoadScale, &cfg.PrefillLoadScale},
		{o.DecodeActiveRequestWeight, &cfg.DecodeActiveRequestWeight},
		{o.SharedCacheMultiplier, &cfg.SharedCacheMultiplier},
		{o.RouterTemperature, &cfg.RouterTemperature},
	} {
		if f.v != nil {
			*f.dst = *f.v
		}
	}
	for _, f := range []struct {
		v   *bool
		dst *bool
	}{
		{o.AssumeKVReuse, &cfg.AssumeKVReuse},
		{o.TrackActiveBlocks, &cfg.TrackActiveBlocks},
		{o.TrackPrefillTokens, &cfg.TrackPrefillTokens},
		{o.InFlightOverlap, &cfg.InFlightOverlap},
		{o.UnclippedOverlapCredit, &cfg.UnclippedOverlapCredit},
	} {
		if f.v != nil {
			*f.dst = *f.v
		}
	}
	if err := cfg.Validate(); err != nil {
		return variant{}, fmt.Errorf("--router-config %s: %w", name, err)
	}
	return variant{name: name, cfg: cfg}, nil
}

// newPolicy builds the named policy for s.
func newPolicy(s *sim, name string, variants []variant) (policy, error) {
	switch name {
	case "kv_router":
		return newRouterPolicy(s, ourRouterConfig())
	case "kv_router_dynamo":
		return newRouterPolicy(s, selection.DefaultConfig())
	case "round_robin":
		return &roundRobin{s: s}, nil
	case "least_loaded":
		return &leastLoaded{s: s}, nil
	case "random":
		return &randomPolicy{s: s, rng: rand.New(rand.NewPCG(s.cfg.Seed, 0x72616e646f6d))}, nil
	case "oracle":
		return &oracle{s: s}, nil
	case "first_block":
		return &firstBlock{s: s}, nil
	}
	for _, v := range variants {
		if v.name == name {
			return newRouterPolicy(s, v.cfg)
		}
	}
	return nil, fmt.Errorf("unknown policy %q (built in: %s; or a --router-config name)", name, strings.Join(builtinPolicies, ", "))
}
