package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/miekg/dns"
)

// targetResolver asks for an SRV target's IPv4 addresses with one A query
// of its own. Go's resolver sorts every answer's addresses by RFC 6724,
// which opens a socket per address to learn its source; an SRV answer
// names up to max_workers targets, each of which may answer thousands of
// addresses: 256 targets of 4,000 took both cores, and every resolution
// timed out. Its own query also keeps only the records of the name asked
// and of the CNAMEs it leads to, where Go's took an answer's records for
// any name.
type targetResolver struct {
	servers  []string      // host:port; none: ask fallback
	fallback *net.Resolver // when no server is known (no /etc/resolv.conf)
	maxAddrs int           // addresses read a target, at most
}

// maxCNAMEs bounds the CNAME chain followed in one answer.
const maxCNAMEs = 8

// newTargetResolver asks server (host:port) when set, else the name
// servers of /etc/resolv.conf.
func newTargetResolver(server string, fallback *net.Resolver, maxAddrs int) *targetResolver {
	t := &targetResolver{fallback: fallback, maxAddrs: maxAddrs}
	if server != "" {
		t.servers = []string{server}
	} else if conf, err := dns.ClientConfigFromFile("/etc/resolv.conf"); err == nil {
		for _, s := range conf.Servers {
			t.servers = append(t.servers, net.JoinHostPort(s, conf.Port))
		}
	}
	return t
}

// errNoSuchTarget is a target without addresses (NXDOMAIN), which an
// SRV answer may name: no server, not a failure.
var errNoSuchTarget = &net.DNSError{Err: "no such host", IsNotFound: true}

// lookup4 is name's IPv4 addresses (name is absolute), at most maxAddrs
// of them; none, without an error, for a name with none.
func (t *targetResolver) lookup4(ctx context.Context, name string) ([]netip.Addr, error) {
	if len(t.servers) == 0 {
		ips, err := t.fallback.LookupNetIP(ctx, "ip4", name)
		if len(ips) > t.maxAddrs {
			ips = ips[:t.maxAddrs]
		}
		return ips, err
	}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	q.SetEdns0(4096, false)
	var errs []error
	for _, server := range t.servers {
		in, err := exchange(ctx, q, server)
		switch {
		case err != nil:
			errs = append(errs, err)
		case in.Rcode == dns.RcodeNameError:
			return nil, errNoSuchTarget
		case in.Rcode != dns.RcodeSuccess:
			errs = append(errs, fmt.Errorf("%s: %s", server, dns.RcodeToString[in.Rcode]))
		default:
			return t.addresses(in, name), nil
		}
	}
	return nil, fmt.Errorf("looking up %s: %w", name, errors.Join(errs...))
}

// exchange sends q to server over UDP, and again over TCP when the answer
// was truncated.
func exchange(ctx context.Context, q *dns.Msg, server string) (*dns.Msg, error) {
	in, _, err := (&dns.Client{Net: "udp"}).ExchangeContext(ctx, q, server)
	if err == nil && in.Truncated {
		in, _, err = (&dns.Client{Net: "tcp"}).ExchangeContext(ctx, q, server)
	}
	return in, err
}

// addresses are the answer's A records of name and of the CNAMEs it leads
// to, in the answer's order, at most maxAddrs.
func (t *targetResolver) addresses(in *dns.Msg, name string) []netip.Addr {
	chain := map[string]bool{strings.ToLower(dns.Fqdn(name)): true}
	for range maxCNAMEs {
		grew := false
		for _, rr := range in.Answer {
			if c, ok := rr.(*dns.CNAME); ok && chain[strings.ToLower(c.Hdr.Name)] && !chain[strings.ToLower(c.Target)] {
				chain[strings.ToLower(c.Target)], grew = true, true
			}
		}
		if !grew {
			break
		}
	}
	var out []netip.Addr
	for _, rr := range in.Answer {
		a, ok := rr.(*dns.A)
		if !ok || !chain[strings.ToLower(a.Hdr.Name)] {
			continue
		}
		if ip, ok := netip.AddrFromSlice(a.A); ok {
			out = append(out, ip.Unmap())
		}
		if len(out) == t.maxAddrs {
			break
		}
	}
	return out
}
