package caddymodule

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Resolution bounds.
const (
	// resolveTimeout bounds one resolution, all its queries together (a
	// refresh shorter than it bounds it instead), so that a resolver that
	// does not answer delays nothing but the next refresh.
	resolveTimeout = 5 * time.Second
	// targetLookups bounds the SRV targets looked up at once.
	targetLookups = 8
)

// newResolver is Go's resolver, asking server (host:port) when set and
// the name servers of /etc/resolv.conf otherwise. Go's own resolver rather
// than the C library's: its errors say whether a name has no records, and
// its lookups can be cancelled. It ends a query's read only at the query's
// deadline, though, even once the lookup is cancelled; so each connection
// is closed when its query's context ends, and a stopping app leaves no
// query behind.
func newResolver(server string) *net.Resolver {
	var d net.Dialer
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
		if server != "" {
			address = server
		}
		c, err := d.DialContext(ctx, network, address)
		if err != nil {
			return nil, err
		}
		// The resolver closes the connection after its query too; the
		// second Close is harmless.
		context.AfterFunc(ctx, func() { _ = c.Close() })
		return c, nil
	}}
}

// answer is one resolution of a name.
type answer struct {
	specs    []workerSpec
	dropped  int  // servers past max_workers, left out
	unusable int  // servers at addresses no worker can have (usableAddr), left out
	empty    bool // the name has no records (NXDOMAIN, or no data)
	// failedTargets are SRV targets whose lookup failed: the answer says
	// nothing of them, and their workers stay as they are.
	failedTargets map[string]bool
}

// isNotFound reports a DNS answer that the name has no such records,
// which is an answer (no workers), not a failure.
func isNotFound(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de) && de.IsNotFound
}

// knownServers are what a name holds: its workers' endpoints and, for
// SRV records, their targets with their addresses. A name past its bound
// keeps them first.
type knownServers struct {
	endpoints map[netip.AddrPort]bool
	targets   map[string]map[netip.Addr]bool
}

// resolve reads the name's records as servers, at most maxWorkers of them:
// first those known, then the others in address order, so that a name
// past its bound keeps what it has and the same answer always gives the
// same servers. An error means the answer could not be had (the resolver
// failed or timed out).
func (s *dnsSettings) resolve(ctx context.Context, r *net.Resolver, t *targetResolver, known knownServers) (answer, error) {
	var specs []workerSpec
	var dropped, targetsUnusable int
	var failed map[string]bool
	var err error
	if s.recordType == recordSRV {
		specs, dropped, targetsUnusable, failed, err = s.resolveSRV(ctx, r, t, known)
	} else {
		specs, err = s.resolveAddrs(ctx, r)
	}
	if isNotFound(err) {
		return answer{empty: true}, nil
	}
	if err != nil {
		return answer{}, err
	}
	n := len(specs)
	specs = slices.DeleteFunc(specs, func(s workerSpec) bool { return !usableAddr(s.ip) })
	unusable := n - len(specs) + targetsUnusable
	slices.SortFunc(specs, func(a, b workerSpec) int {
		ka, kb := known.endpoints[a.addrPort()], known.endpoints[b.addrPort()]
		if ka != kb {
			if ka {
				return -1
			}
			return 1
		}
		return cmp.Or(a.ip.Compare(b.ip), cmp.Compare(a.httpPort, b.httpPort))
	})
	specs = slices.CompactFunc(specs, func(a, b workerSpec) bool { return a.endpoint() == b.endpoint() })
	if len(specs) > s.maxWorkers {
		dropped += len(specs) - s.maxWorkers
		specs = specs[:s.maxWorkers]
	}
	return answer{specs: specs, dropped: dropped, unusable: unusable, failedTargets: failed,
		empty: len(specs) == 0 && dropped == 0 && unusable == 0 && len(failed) == 0}, nil
}

// usableAddr reports whether a worker can be at ip: not an unspecified,
// link-local, multicast, broadcast or reserved (240.0.0.0/4) address. A
// DNS answer gave such addresses workers, and engine facts dialled them
// (169.254.169.254, a cloud's metadata service, would have been read and
// proxied to). Loopback stays: a gateway and its engines on one host.
func usableAddr(ip netip.Addr) bool {
	ip = ip.Unmap()
	switch {
	case !ip.IsValid(), ip.IsUnspecified(), ip.IsLinkLocalUnicast(), ip.IsMulticast(), ip.IsInterfaceLocalMulticast():
		return false
	case ip.Is4():
		return ip.As4()[0] < 240 // 240.0.0.0/4 reserved, 255.255.255.255 broadcast
	}
	return true
}

// resolveAddrs reads A or AAAA records: a server per address, on the
// configured ports.
func (s *dnsSettings) resolveAddrs(ctx context.Context, r *net.Resolver) ([]workerSpec, error) {
	network := "ip4"
	if s.recordType == recordAAAA {
		network = "ip6"
	}
	ips, err := r.LookupNetIP(ctx, network, s.name)
	if err != nil {
		return nil, err
	}
	specs := make([]workerSpec, 0, len(ips))
	for _, ip := range ips {
		spec := s.spec(ip.Unmap(), s.httpPort, "")
		specs = append(specs, spec)
	}
	return specs, nil
}

// spec is a server of this name at ip:httpPort, with the configured
// event and replay ports.
func (s *dnsSettings) spec(ip netip.Addr, httpPort uint16, target string) workerSpec {
	return workerSpec{ip: ip, httpPort: httpPort, eventsPort: s.eventsPort, replayPort: s.replayPort, target: target,
		model: s.model, group: s.group, blockSize: s.blockSize, dpSize: s.dpSize}
}

// srvRecord is one SRV record that names a server.
type srvRecord struct {
	target string // canonicalName of the record's target
	port   uint16
}

// resolveSRV reads SRV records: a server per record, at its target's IPv4
// addresses and its port, with the event and replay ports of the sibling
// names when configured. Priorities and weights are ignored: every record
// is a worker. At most maxWorkers records are followed to their targets,
// those whose target the name holds first; it returns how many were not.
func (s *dnsSettings) resolveSRV(ctx context.Context, r *net.Resolver, t *targetResolver, known knownServers) (specs []workerSpec, dropped, unusable int, failed map[string]bool, err error) {
	recs, err := lookupSRV(ctx, r, s.name)
	if err != nil {
		return nil, 0, 0, nil, err
	}
	if len(recs) > s.maxWorkers {
		slices.SortStableFunc(recs, func(a, b srvRecord) int {
			ka, kb := len(known.targets[a.target]) > 0, len(known.targets[b.target]) > 0
			switch {
			case ka && !kb:
				return -1
			case kb && !ka:
				return 1
			}
			return 0
		})
		dropped, recs = len(recs)-s.maxWorkers, recs[:s.maxWorkers]
	}
	var events, replay map[string]uint16
	if s.eventsSRV != "" {
		if events, err = siblingPorts(ctx, r, s.eventsSRV); err != nil {
			return nil, 0, 0, nil, fmt.Errorf("%s: %w", s.eventsSRV, err)
		}
	}
	if s.replaySRV != "" {
		if replay, err = siblingPorts(ctx, r, s.replaySRV); err != nil {
			return nil, 0, 0, nil, fmt.Errorf("%s: %w", s.replaySRV, err)
		}
	}
	addrs, failed, unusable := lookupTargets(ctx, t, recs, s.maxWorkers, known)
	for i, rec := range recs {
		for _, ip := range addrs[i] {
			spec := s.spec(ip, rec.port, rec.target)
			if events != nil {
				spec.eventsPort = events[rec.target]
				if int(spec.eventsPort)+int(s.dpSize)-1 > 65535 {
					spec.eventsPort = 0
				}
			}
			if replay != nil {
				spec.replayPort = replay[rec.target]
			}
			specs = append(specs, spec)
		}
	}
	return specs, dropped, unusable, failed, nil
}

// lookupSRV reads a name's SRV records, without repeats, in (target, port)
// order, leaving out those that name no server (target ".", port 0).
func lookupSRV(ctx context.Context, r *net.Resolver, name string) ([]srvRecord, error) {
	_, srvs, err := r.LookupSRV(ctx, "", "", name)
	if err != nil && len(srvs) == 0 {
		return nil, err
	}
	// An error with records: Go left out the records whose target is not
	// a valid name, and those kept are usable.
	recs := make([]srvRecord, 0, len(srvs))
	for _, srv := range srvs {
		target := canonicalName(srv.Target)
		if target == "" || srv.Port == 0 {
			continue
		}
		recs = append(recs, srvRecord{target: target, port: srv.Port})
	}
	slices.SortFunc(recs, func(a, b srvRecord) int {
		return cmp.Or(cmp.Compare(a.target, b.target), cmp.Compare(a.port, b.port))
	})
	return slices.Compact(recs), nil
}

// siblingPorts reads a sibling SRV name as target → port; a name without
// records gives none.
func siblingPorts(ctx context.Context, r *net.Resolver, name string) (map[string]uint16, error) {
	recs, err := lookupSRV(ctx, r, name)
	if isNotFound(err) {
		return map[string]uint16{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := make(map[string]uint16, len(recs))
	for _, rec := range recs {
		if _, dup := out[rec.target]; !dup { // the lowest port of a target listed twice
			out[rec.target] = rec.port
		}
	}
	return out, nil
}

// lookupTargets finds the IPv4 addresses of the records' targets, a few at
// once, maxWorkers of them in all at most (on Kubernetes a target is a
// pod, with one). Each record has its share of maxWorkers, and a share a
// record leaves unused goes to the others (shareOut); within a record's
// share, the addresses the name holds on its port come first, then the
// rest in answer order, so that a target answering more than its share
// in rotation keeps its workers. An endpoint an earlier record has (two
// targets with the same addresses) counts once, and addresses no worker
// can have count not at all: either took shares that went empty. Read up
// to max_workers a target, 256 targets of 4,000 addresses took 287 MB and
// a quarter of a core a resolution; a target's answer is read over TCP
// only when it does not hold the record's even share or, for a few
// targets a resolution, the addresses the name holds of it. A target
// without an address gives none. A target whose lookup failed is in
// failed (its workers stay), and the rest of the answer stands, even when
// every target failed: the SRV answer still says which targets are gone.
// One target failing failed the whole answer: 20 targets failing 10 % of
// the time left 27 of 30 resolutions failed, and targets gone from the
// answer kept their workers for as long as the others failed.
func lookupTargets(ctx context.Context, t *targetResolver, recs []srvRecord, maxWorkers int, known knownServers) (addrs [][]netip.Addr, failed map[string]bool, unusable int) {
	addrs = make([][]netip.Addr, len(recs))
	errs := make([]error, len(recs))
	byTarget := map[string]int{} // the first record of each target: its lookup serves the others
	for i, rec := range recs {
		if _, dup := byTarget[rec.target]; !dup {
			byTarget[rec.target] = i
		}
	}
	// A share a record, not a target: one target listed under many ports
	// makes a server of each port and address (256 ports of 256
	// addresses: 65,536 servers built and sorted a resolution).
	even := max(1, (maxWorkers+len(recs)-1)/max(1, len(recs)))
	sem := make(chan struct{}, targetLookups)
	var wg sync.WaitGroup
	var heldRereads, unusableAddrs atomic.Int32
	heldRereads.Store(maxHeldRereads)
	for target, i := range byTarget {
		sem <- struct{}{}
		tq := targetQuery{want: even, maxAddrs: maxWorkers, held: known.targets[target], heldRereads: &heldRereads,
			unusable: &unusableAddrs}
		wg.Go(func() {
			defer func() { <-sem }()
			ips, err := t.lookup4(ctx, target+".", tq)
			if isNotFound(err) {
				err = nil
			}
			addrs[i], errs[i] = ips, err
		})
	}
	wg.Wait()
	for target, i := range byTarget {
		if errs[i] != nil {
			if failed == nil {
				failed = map[string]bool{}
			}
			failed[target] = true
		}
	}
	candidates := make([][]netip.Addr, len(recs))
	counts := make([]int, len(recs))
	taken := map[netip.AddrPort]bool{}
	claim := func(i int, ip netip.Addr) {
		if ep := netip.AddrPortFrom(ip, recs[i].port); !taken[ep] {
			taken[ep] = true
			candidates[i] = append(candidates[i], ip)
		}
	}
	// An endpoint the name holds under a target stays that target's (moved
	// to another, its event and replay ports would follow the other's
	// siblings). Then the records with fewest addresses claim theirs
	// first: a pod's one address, also in a large target's answer, stays
	// the pod's, where the large target's share might have left it out.
	for i, rec := range recs {
		for _, ip := range addrs[byTarget[rec.target]] {
			if known.targets[rec.target][ip] && known.endpoints[netip.AddrPortFrom(ip, rec.port)] {
				claim(i, ip)
			}
		}
	}
	for _, i := range fewestFirst(len(recs), func(i int) int { return len(addrs[byTarget[recs[i].target]]) }) {
		for _, ip := range addrs[byTarget[recs[i].target]] {
			claim(i, ip)
		}
		counts[i] = len(candidates[i])
	}
	shares := shareOut(counts, maxWorkers)
	for i, rec := range recs {
		addrs[i] = knownFirst(candidates[i], rec.port, shares[i], known.endpoints)
	}
	return addrs, failed, int(unusableAddrs.Load())
}
