package caddymodule

import (
	"math"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("kv_router", parseGlobalOption)
	httpcaddyfile.RegisterHandlerDirective("kv_selection", parseSelectionHandler)
	httpcaddyfile.RegisterDirectiveOrder("kv_selection", httpcaddyfile.Before, "reverse_proxy")
	httpcaddyfile.RegisterHandlerDirective("kv_router", parseRouterHandler)
	httpcaddyfile.RegisterDirectiveOrder("kv_router", httpcaddyfile.Before, "reverse_proxy")
}

// parseGlobalOption sets up the kv_router app from the kv_router global
// option; see App.UnmarshalCaddyfile for the syntax.
func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	if existing != nil {
		return nil, d.Err("kv_router global option may be given only once")
	}
	app := new(App)
	if err := app.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	return httpcaddyfile.App{
		Name:  "kv_router",
		Value: caddyconfig.JSON(app, nil),
	}, nil
}

// UnmarshalCaddyfile sets up the kv_router app from Caddyfile tokens.
// Syntax:
//
//	kv_router {
//		block_size <tokens>
//		use_kv_events on|off
//		kv_events_bind <zmq endpoint>
//		kv_events_bind_peers worker_host|any
//		index_max_entries <entries>
//
//		overlap_score_credit <float>
//		overlap_score_credit_decay <float>
//		prefill_load_scale <float>
//		decode_active_request_weight <float>
//		host_cache_hit_weight <float>
//		disk_cache_hit_weight <float>
//		shared_cache_multiplier <float>
//		router_temperature <float>
//		decode_busy_threshold <float>
//		prefill_busy_threshold <float>
//		assume_kv_reuse on|off
//		track_prefill_tokens on|off
//		track_active_blocks on|off
//		track_output_blocks on|off
//		in_flight_overlap on|off
//		unclipped_overlap_credit on|off
//
//		approx_ttl <duration>
//		session_affinity_ttl <duration>
//		session_affinity_mode hard|soft
//		session_table_cap <count>
//		pending_ttl <duration>
//		pending_max_entries <count>
//		pending_max_bytes <size>
//		reservation_ttl <duration>
//		worker_down_after <duration>
//		max_workers <count>
//
//		max_ranks_per_worker <count>
//		max_ranks <count>
//		max_reservations_per_worker <count>
//		max_reservations_per_client <count>
//		max_reservation_blocks_per_client <count>
//		max_dump_events <count>
//		index_max_memory <size>
//		kv_events_max_message <size>
//		kv_events_max_gap <count>
//		kv_events_cores <count>
//		kv_events_max_peers <count>
//
//		engine_facts on|off
//		engine_facts_interval <duration>
//		engine_facts_timeout <duration>
//
//		discover dns <name> {
//			(docs/discovery.md; DiscoveryConfig.unmarshalCaddyfile)
//		}
//
//		cluster <nats url>... {
//			(docs/replicas.md; ClusterConfig.unmarshalCaddyfile)
//		}
//
//		worker <id> {
//			endpoint <host:port>
//			model_name <name>
//			routing_group <name>
//			kv_events <zmq endpoint>
//			replay <zmq endpoint>
//			block_size <tokens>
//			dp_start <rank>
//			dp_size <ranks>
//			max_num_batched_tokens <tokens>
//			total_kv_blocks <blocks>
//		}
//	}
//
// Booleans are on, off, true or false. Durations use Caddy's duration
// syntax (for example 90s, 10m, 1d) and sizes take units (for example
// 256MiB). The worker subdirective may be
// repeated, once per worker.
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume option name
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		var err error
		switch name {
		case "block_size":
			a.BlockSize, err = parseUint32(d)
		case "use_kv_events":
			a.UseKVEvents, err = parseBool(d)
		case "index_max_entries":
			var v *float64
			if v, err = parseFloat(d); err == nil {
				if *v < 0 || *v != float64(int64(*v)) {
					return d.Errf("index_max_entries must be a whole number of entries, not %v", *v)
				}
				a.IndexMaxEntries = int64(*v)
			}
		case "kv_events_bind":
			a.KVEventsBind, err = singleArg(d)
		case "kv_events_bind_peers":
			a.KVEventsBindPeers, err = singleArg(d)
		case "overlap_score_credit":
			a.OverlapScoreCredit, err = parseFloat(d)
		case "overlap_score_credit_decay":
			a.OverlapScoreCreditDecay, err = parseFloat(d)
		case "prefill_load_scale":
			a.PrefillLoadScale, err = parseFloat(d)
		case "decode_active_request_weight":
			a.DecodeActiveRequestWeight, err = parseFloat(d)
		case "host_cache_hit_weight":
			a.HostCacheHitWeight, err = parseFloat(d)
		case "disk_cache_hit_weight":
			a.DiskCacheHitWeight, err = parseFloat(d)
		case "shared_cache_multiplier":
			a.SharedCacheMultiplier, err = parseFloat(d)
		case "router_temperature":
			a.RouterTemperature, err = parseFloat(d)
		case "decode_busy_threshold":
			a.DecodeBusyThreshold, err = parseFloat(d)
		case "prefill_busy_threshold":
			a.PrefillBusyThreshold, err = parseFloat(d)
		case "assume_kv_reuse":
			a.AssumeKVReuse, err = parseBool(d)
		case "track_prefill_tokens":
			a.TrackPrefillTokens, err = parseBool(d)
		case "track_active_blocks":
			a.TrackActiveBlocks, err = parseBool(d)
		case "track_output_blocks":
			a.TrackOutputBlocks, err = parseBool(d)
		case "in_flight_overlap":
			a.InFlightOverlap, err = parseBool(d)
		case "unclipped_overlap_credit":
			a.UnclippedOverlapCredit, err = parseBool(d)
		case "approx_ttl":
			a.ApproxTTL, err = parseDuration(d)
		case "session_affinity_ttl":
			a.SessionAffinityTTL, err = parseDuration(d)
		case "session_affinity_mode":
			var mode string
			if mode, err = singleArg(d); err == nil {
				if mode != "hard" && mode != "soft" {
					err = d.Errf("session_affinity_mode must be hard or soft, not %q", mode)
				}
				a.SessionAffinityMode = mode
			}
		case "session_table_cap":
			a.SessionTableCap, err = parseCount(d)
		case "pending_ttl":
			a.PendingTTL, err = parseDuration(d)
		case "pending_max_entries":
			a.PendingMaxEntries, err = parseCount(d)
		case "pending_max_bytes":
			a.PendingMaxBytes, err = parseSize(d)
		case "reservation_ttl":
			a.ReservationTTL, err = parseDuration(d)
		case "worker_down_after":
			var dur caddy.Duration
			if dur, err = parseDuration(d); err == nil {
				a.WorkerDownAfter = &dur
			}
		case "max_workers":
			a.MaxWorkers, err = parseCount(d)
		case "worker":
			var w WorkerConfig
			if err = w.unmarshalCaddyfile(d); err == nil {
				a.Workers = append(a.Workers, w)
			}
		default:
			var handled bool
			if handled, err = a.Limits.unmarshalCaddyfile(d); !handled {
				if handled, err = a.EngineFactsConfig.unmarshalCaddyfile(d); !handled {
					if handled, err = a.DiscoveryConfig.unmarshalCaddyfile(d); !handled {
						if handled, err = a.ClusterConfig.unmarshalCaddyfile(d); !handled {
							return d.Errf("unrecognized subdirective %s", name)
						}
					}
				}
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// unmarshalCaddyfile reads one worker subdirective, from its id to the end
// of its block.
func (w *WorkerConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	id, err := strconv.ParseUint(d.Val(), 10, 64)
	if err != nil {
		return d.Errf("worker id %q must be an unsigned integer", d.Val())
	}
	w.WorkerID = &id
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		switch name {
		case "endpoint":
			w.Endpoint, err = singleArg(d)
		case "model_name":
			w.ModelName, err = singleArg(d)
		case "routing_group":
			w.RoutingGroup, err = singleArg(d)
		case "kv_events":
			w.KVEventsEndpoint, err = singleArg(d)
		case "replay":
			w.ReplayEndpoint, err = singleArg(d)
		case "block_size":
			w.BlockSize, err = parseUint32(d)
		case "dp_start":
			w.DataParallelStartRank, err = parseUint32(d)
		case "dp_size":
			w.DataParallelSize, err = parseUint32(d)
		case "max_num_batched_tokens":
			w.MaxNumBatchedTokens, err = parseUint64(d)
		case "total_kv_blocks":
			w.TotalKVBlocks, err = parseUint64(d)
		default:
			return d.Errf("unrecognized worker subdirective %s", name)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// parseSelectionHandler sets up the kv_selection handler directive; see
// SelectionHandler.UnmarshalCaddyfile for the syntax.
func parseSelectionHandler(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	s := new(SelectionHandler)
	err := s.UnmarshalCaddyfile(h.Dispenser)
	return s, err
}

// UnmarshalCaddyfile sets up the kv_selection handler from Caddyfile tokens.
// Syntax:
//
//	kv_selection [<matcher>] {
//		max_body_size <size>
//		write_token <secret>
//	}
//
// The size takes units, for example 8MiB or 512KB. The token may be a
// placeholder such as {env.KVROUTER_WRITE_TOKEN}.
func (h *SelectionHandler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "max_body_size":
			size, err := parseSize(d)
			if err != nil {
				return err
			}
			h.MaxBodySize = size
		case "write_token":
			token, err := singleArg(d)
			if err != nil {
				return err
			}
			if token == "" {
				// {$VAR} is replaced as the Caddyfile is read: an unset
				// variable left the token empty, and an empty token was
				// dropped from the JSON, which opened the catalog to
				// loopback writes without a word.
				return d.Err("write_token is empty (is the environment variable in {$...} set?)")
			}
			h.WriteToken = token
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

func parseRouterHandler(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	r := new(Handler)
	err := r.UnmarshalCaddyfile(h.Dispenser)
	return r, err
}

// UnmarshalCaddyfile sets up the kv_router handler from Caddyfile tokens.
// Syntax:
//
//	kv_router [<matcher>] {
//		max_body_size <size>
//		body_timeout <duration>
//		routing_group_header <header>
//		session_header <header>
//		tokenize on|off
//		tokenize_timeout <duration>
//		tokenize_cache <tokens>
//		request_usage on|off
//		explain on|off
//		overload [off] { ... }   (overload_config.go)
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "max_body_size":
			h.MaxBodySize, err = parseSize(d)
		case "body_timeout":
			h.BodyTimeout, err = parseDuration(d)
		case "routing_group_header":
			h.RoutingGroupHeader, err = singleArg(d)
		case "session_header":
			h.SessionHeader, err = singleArg(d)
		case "tokenize":
			h.Tokenize, err = parseBool(d)
		case "tokenize_timeout":
			h.TokenizeTimeout, err = parseDuration(d)
		case "tokenize_cache":
			var n int
			if n, err = parseCount(d); err == nil {
				h.TokenizeCache = &n
			}
		case "request_usage":
			h.RequestUsage, err = parseBool(d)
		case "explain":
			var v *bool
			if v, err = parseBool(d); err == nil {
				h.Explain = *v
			}
		case "overload":
			h.Overload, err = unmarshalOverload(d)
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// singleArg reads the one argument of the current subdirective.
func singleArg(d *caddyfile.Dispenser) (string, error) {
	if !d.NextArg() {
		return "", d.ArgErr()
	}
	v := d.Val()
	if d.NextArg() {
		return "", d.ArgErr()
	}
	return v, nil
}

func parseBool(d *caddyfile.Dispenser) (*bool, error) {
	name := d.Val()
	v, err := singleArg(d)
	if err != nil {
		return nil, err
	}
	var b bool
	switch v {
	case "on", "true":
		b = true
	case "off", "false":
		b = false
	default:
		return nil, d.Errf("%s must be on or off, not %q", name, v)
	}
	return &b, nil
}

func parseFloat(d *caddyfile.Dispenser) (*float64, error) {
	name := d.Val()
	v, err := singleArg(d)
	if err != nil {
		return nil, err
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return nil, d.Errf("%s must be a finite non-negative number, not %q", name, v)
	}
	return &f, nil
}

func parseUint32(d *caddyfile.Dispenser) (uint32, error) {
	n, err := parseUint(d, 32)
	return uint32(n), err
}

func parseUint64(d *caddyfile.Dispenser) (uint64, error) {
	return parseUint(d, 64)
}

func parseUint(d *caddyfile.Dispenser, bits int) (uint64, error) {
	name := d.Val()
	v, err := singleArg(d)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(v, 10, bits)
	if err != nil {
		return 0, d.Errf("%s must be an unsigned %d-bit integer, not %q", name, bits, v)
	}
	return n, nil
}

// parseCount reads a non-negative int.
func parseCount(d *caddyfile.Dispenser) (int, error) {
	name := d.Val()
	v, err := singleArg(d)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, d.Errf("%s must be a non-negative integer, not %q", name, v)
	}
	return n, nil
}

// parseSize reads a positive byte size with optional units (8MiB, 512KB).
func parseSize(d *caddyfile.Dispenser) (int64, error) {
	name := d.Val()
	v, err := singleArg(d)
	if err != nil {
		return 0, err
	}
	size, err := humanize.ParseBytes(v)
	if err != nil {
		return 0, d.Errf("parsing %s: %v", name, err)
	}
	if size == 0 || size > math.MaxInt64 {
		return 0, d.Errf("%s %s is out of range", name, v)
	}
	return int64(size), nil
}

func parseDuration(d *caddyfile.Dispenser) (caddy.Duration, error) {
	name := d.Val()
	v, err := singleArg(d)
	if err != nil {
		return 0, err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return 0, d.Errf("parsing %s: %v", name, err)
	}
	if dur < 0 {
		return 0, d.Errf("%s must not be negative", name)
	}
	return caddy.Duration(dur), nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*App)(nil)
	_ caddyfile.Unmarshaler = (*SelectionHandler)(nil)
)
