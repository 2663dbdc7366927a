package caddymodule

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// unmarshalCaddyfile reads a cluster subdirective at d, reporting whether
// it was one. Syntax (docs/replicas.md):
//
//	cluster <nats url>... {
//		name                <replica>
//		prefix              <subject prefix>
//		credentials         <file>
//		tls_ca              <file>
//		tls_cert            <file>
//		tls_key             <file>
//		heartbeat           <duration>
//		lease               <duration>
//		max_remote_bookings <count>
//		max_remote_blocks <count>
//		max_message_bytes   <size>
//		max_hashes          <count>
//		queue_length        <count>
//		max_catalog_value_bytes <size>
//	}
//
// The block is optional; the subdirective may be given once.
func (c *ClusterConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) (bool, error) {
	if d.Val() != "cluster" {
		return false, nil
	}
	if c.Cluster != nil {
		return true, d.Err("cluster may be given once")
	}
	s := &ClusterSettings{URLs: d.RemainingArgs()}
	if len(s.URLs) == 0 {
		return true, d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "name":
			s.Name, err = singleArg(d)
		case "prefix":
			s.Prefix, err = singleArg(d)
		case "credentials":
			s.Credentials, err = singleArg(d)
		case "tls_ca":
			s.TLSCA, err = singleArg(d)
		case "tls_cert":
			s.TLSCert, err = singleArg(d)
		case "tls_key":
			s.TLSKey, err = singleArg(d)
		case "heartbeat":
			s.Heartbeat, err = parseDuration(d)
		case "lease":
			s.Lease, err = parseDuration(d)
		case "max_remote_bookings":
			s.MaxRemoteBookings, err = parseCount(d)
		case "max_remote_blocks":
			s.MaxRemoteBlocks, err = parseCount(d)
		case "max_message_bytes":
			var n int64
			if n, err = parseSize(d); err == nil {
				s.MaxMessageBytes = int(n)
			}
		case "max_hashes":
			s.MaxHashes, err = parseCount(d)
		case "queue_length":
			s.QueueLength, err = parseCount(d)
		case "max_catalog_value_bytes":
			var n int64
			if n, err = parseSize(d); err == nil {
				s.MaxCatalogValueBytes = int(n)
			}
		default:
			return true, d.Errf("unrecognized cluster subdirective %s", d.Val())
		}
		if err != nil {
			return true, err
		}
	}
	c.Cluster = s
	if _, err := s.config(0, nil); err != nil {
		return true, d.Err(err.Error())
	}
	return true, nil
}
