package caddymodule

import (
	"strconv"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// unmarshalCaddyfile reads a discover subdirective at d, reporting whether
// it was one. Syntax (docs/discovery.md):
//
//	discover dns <name> {
//		type           a|aaaa|srv
//		http_port      <port>
//		kv_events_port <port>|off
//		replay_port    <port>|off
//		kv_events_srv  <port name>
//		replay_srv     <port name>
//		refresh        <duration>
//		resolver       <host[:port]>
//		model_name     <name>
//		routing_group  <name>
//		block_size     <tokens>
//		dp_size        <ranks>
//		max_workers    <count>
//	}
//
// The block is optional; it may be repeated, once per name.
func (c *DiscoveryConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) (bool, error) {
	if d.Val() != "discover" {
		return false, nil
	}
	var e DNSDiscovery
	if err := e.unmarshalCaddyfile(d); err != nil {
		return true, err
	}
	c.Discover = append(c.Discover, e)
	if err := c.validate(); err != nil {
		return true, d.Err(err.Error())
	}
	return true, nil
}

// unmarshalCaddyfile reads one discover subdirective, from its source to
// the end of its block.
func (e *DNSDiscovery) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	if d.Val() != "dns" {
		return d.Errf("discover %s: the source must be dns", d.Val())
	}
	if !d.NextArg() {
		return d.ArgErr()
	}
	e.DNS = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "type":
			e.Type, err = singleArg(d)
		case "http_port":
			var p *int
			if p, err = parsePort(d, false); err == nil {
				e.HTTPPort = *p
			}
		case "kv_events_port":
			e.KVEventsPort, err = parsePort(d, true)
		case "replay_port":
			e.ReplayPort, err = parsePort(d, true)
		case "kv_events_srv":
			e.KVEventsSRV, err = singleArg(d)
		case "replay_srv":
			e.ReplaySRV, err = singleArg(d)
		case "refresh":
			e.Refresh, err = parseDuration(d)
		case "resolver":
			e.Resolver, err = singleArg(d)
		case "model_name":
			e.ModelName, err = singleArg(d)
		case "routing_group":
			e.RoutingGroup, err = singleArg(d)
		case "block_size":
			e.BlockSize, err = parseUint32(d)
		case "dp_size":
			e.DataParallelSize, err = parseUint32(d)
		case "max_workers":
			e.MaxWorkers, err = parseCount(d)
		default:
			return d.Errf("unrecognized discover subdirective %s", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// parsePort reads a port, 1 to 65535, or off (as 0) when allowed.
func parsePort(d *caddyfile.Dispenser, allowOff bool) (*int, error) {
	name := d.Val()
	v, err := singleArg(d)
	if err != nil {
		return nil, err
	}
	if allowOff && v == "off" {
		return new(0), nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 65535 {
		if allowOff {
			return nil, d.Errf("%s must be a port between 1 and 65535 or off, not %q", name, v)
		}
		return nil, d.Errf("%s must be a port between 1 and 65535, not %q", name, v)
	}
	return &n, nil
}
