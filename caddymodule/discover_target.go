package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// targetResolver asks for an SRV target's IPv4 addresses with one A query
// of its own. Go's resolver sorts every answer's addresses by RFC 6724,
// which opens a socket per address to learn its source; an SRV answer
// names up to max_workers targets, each of which may answer thousands of
// addresses: 256 targets of 4,000 took both cores, and every resolution
// timed out. Its own query also keeps only the records of the name asked
// and of the CNAMEs it leads to, where Go's took an answer's records for
// any name. Unlike Go's, it reads no /etc/hosts and none of
// /etc/resolv.conf's options (timeout, attempts, rotate): it asks each
// name server in turn, within the resolution's time.
type targetResolver struct {
	servers  []string      // host:port; none: ask fallback
	fallback *net.Resolver // when no server is known (no /etc/resolv.conf)
}

// maxCNAMEs bounds the CNAME chain followed from the name asked.
const maxCNAMEs = 8

// newTargetResolver asks server (host:port) when set, else the name
// servers of /etc/resolv.conf.
func newTargetResolver(server string, fallback *net.Resolver) *targetResolver {
	t := &targetResolver{fallback: fallback}
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

// targetQuery is what one target's lookup is to read: at most maxAddrs
// addresses, those held (a worker's already) first, and over TCP when a
// truncated answer holds fewer than want, or, while the resolution's
// heldRereads last, not all those held.
type targetQuery struct {
	want, maxAddrs int
	held           map[netip.Addr]bool
	// heldRereads are the TCP reads the resolution may still make for
	// held addresses alone, shared by its targets: a target answering
	// thousands in rotation lacks some of them nearly every time, and 256
	// such targets read over TCP at each refresh cost 280 MB and 0.4 s.
	heldRereads *atomic.Int32
	// unusable counts the addresses the resolution's answers left out
	// (usableAddr); nil: not counted.
	unusable *atomic.Int32
}

// maxHeldRereads bounds a resolution's TCP reads for held addresses.
const maxHeldRereads = 8

// lookup4 is name's usable IPv4 addresses (name is absolute), as tq
// says; none, without an error, for a name with none.
func (t *targetResolver) lookup4(ctx context.Context, name string, tq targetQuery) ([]netip.Addr, error) {
	if len(t.servers) == 0 {
		ips, err := t.fallback.LookupNetIP(ctx, "ip4", name)
		for j := range ips {
			ips[j] = ips[j].Unmap()
		}
		n := len(ips)
		ips = slices.DeleteFunc(ips, func(ip netip.Addr) bool { return !usableAddr(ip) })
		tq.count(n - len(ips))
		slices.SortStableFunc(ips, func(a, b netip.Addr) int { return keptFirst(tq.held[a], tq.held[b]) })
		return ips[:min(len(ips), tq.maxAddrs)], err
	}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	q.SetEdns0(4096, false)
	var errs []error
	for _, server := range t.servers {
		in, addrs, err := exchange(ctx, q, server, name, tq)
		switch {
		case err != nil:
			errs = append(errs, err)
		case in.Rcode == dns.RcodeNameError:
			return nil, errNoSuchTarget
		case in.Rcode != dns.RcodeSuccess:
			errs = append(errs, fmt.Errorf("%s: %s", server, dns.RcodeToString[in.Rcode]))
		default:
			return addrs, nil
		}
	}
	return nil, fmt.Errorf("looking up %s: %w", name, errors.Join(errs...))
}

// exchange sends q, name's A query, to server over UDP, and reads the
// answer's addresses of name as tq says. A truncated answer is asked
// again over TCP only when it does not hold tq.want (a target's share),
// or, within the resolution's budget, every address held (a target of
// 4,000 addresses in rotation kept 6 % of its workers an answer without
// it). A target is one pod, and a 4,096-byte answer already holds some
// 250 addresses (read over TCP whatever it held, a target's 4,000 cost its
// whole 64 KiB to unpack; never read over TCP, a target of 300 addresses
// in rotation flapped between the 254 each answer held, and a long CNAME
// chain cut short gave none). When TCP fails (refused, silent, or out of
// time), a UDP answer that held any address is used as it is: where
// TCP/53 is blocked, a target failing at each refresh kept its workers,
// stale ones included, for good. The connection is closed when ctx ends:
// the library heeds deadlines, not cancellation, and a stopping config
// would wait out a silent server.
func exchange(ctx context.Context, q *dns.Msg, server, name string, tq targetQuery) (*dns.Msg, []netip.Addr, error) {
	in, err := exchangeOver(ctx, "udp", q, server)
	if err != nil {
		return nil, nil, err
	}
	addrs, unusable := addresses(in, name, tq.maxAddrs, tq.held)
	if !in.Truncated {
		tq.count(unusable)
		return in, addrs, nil
	}
	short := len(addrs) < tq.want
	lacking := heldIn(addrs, tq.held) < min(len(tq.held), tq.maxAddrs)
	if short || lacking && tq.heldRereads != nil && tq.heldRereads.Add(-1) >= 0 {
		tcp, err := exchangeTCP(ctx, q, server)
		switch {
		case err == nil:
			addrs, unusable = addresses(tcp, name, tq.maxAddrs, tq.held)
			tq.count(unusable)
			return tcp, addrs, nil
		case len(addrs) == 0:
			return nil, nil, err
		}
	}
	tq.count(unusable)
	return in, addrs, nil
}

// count adds n to the resolution's unusable addresses.
func (tq *targetQuery) count(n int) {
	if tq.unusable != nil && n > 0 {
		tq.unusable.Add(int32(n))
	}
}

// maxTCPRead bounds a TCP re-read, and it takes half the resolution's
// time left at most: a server that accepts TCP and never answers held
// each read to the resolution's end (the library's 2 s at most), and with
// it one of the few lookups at once, so that at refresh 1s 18 of 20
// targets failed, keeping their workers, stale ones included.
const maxTCPRead = time.Second

// exchangeTCP asks q over TCP within maxTCPRead, and half of ctx's time
// left.
func exchangeTCP(ctx context.Context, q *dns.Msg, server string) (*dns.Msg, error) {
	limit := maxTCPRead
	if deadline, ok := ctx.Deadline(); ok {
		limit = min(limit, time.Until(deadline)/2)
	}
	tctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	return exchangeOver(tctx, "tcp", q, server)
}

func exchangeOver(ctx context.Context, network string, q *dns.Msg, server string) (*dns.Msg, error) {
	c := &dns.Client{Net: network}
	conn, err := c.DialContext(ctx, server)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	in, _, err := c.ExchangeWithConnContext(ctx, q, conn)
	return in, err
}

// addresses are the answer's usable A records (usableAddr) of name and of
// the CNAMEs it leads to (a chain of maxCNAMEs at most), at most maxAddrs:
// those held first, then the others, each in the answer's order. Two
// passes over the answer rather than all its addresses gathered and
// sorted: a target's answer may hold 4,000. unusable counts those left
// out for it.
func addresses(in *dns.Msg, name string, maxAddrs int, held map[netip.Addr]bool) (out []netip.Addr, unusable int) {
	aliases := map[string]string{}
	for _, rr := range in.Answer {
		if c, ok := rr.(*dns.CNAME); ok {
			aliases[strings.ToLower(c.Hdr.Name)] = strings.ToLower(c.Target)
		}
	}
	chain := map[string]bool{}
	for n, links := strings.ToLower(dns.Fqdn(name)), 0; n != "" && !chain[n] && links <= maxCNAMEs; n, links = aliases[n], links+1 {
		chain[n] = true
	}
	for _, heldPass := range [2]bool{true, false} {
		for _, rr := range in.Answer {
			if len(out) == maxAddrs {
				return out, unusable
			}
			a, ok := rr.(*dns.A)
			if !ok || !chain[strings.ToLower(a.Hdr.Name)] {
				continue
			}
			ip, ok := netip.AddrFromSlice(a.A)
			switch {
			case !ok:
			case !usableAddr(ip):
				if heldPass {
					unusable++
				}
			case held[ip.Unmap()] == heldPass:
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, unusable
}

// heldIn counts the addresses of addrs in held: its first, as addresses
// puts them first.
func heldIn(addrs []netip.Addr, held map[netip.Addr]bool) int {
	n := 0
	for n < len(addrs) && held[addrs[n]] {
		n++
	}
	return n
}

// keptFirst orders a kept address before one not kept.
func keptFirst(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}
