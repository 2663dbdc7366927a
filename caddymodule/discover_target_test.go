package caddymodule

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestTargetResolverReadsTheNameAsked: an SRV target's addresses are the
// answer's A records of the name asked and of the CNAMEs it leads to, at
// most maxAddrs of them; a record for another name in the answer is not
// one (Go's resolver took it); a target without records is none, a
// failing server an error.
func TestTargetResolverReadsTheNameAsked(t *testing.T) {
	d := startTestDNS(t)
	a := func(name, ip string) dns.RR {
		return &dns.A{Hdr: dns.RR_Header{Name: fqdn(name), Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.ParseIP(ip).To4()}
	}
	d.set(dnsKey{fqdn("t1.test"), dns.TypeA}, []dns.RR{a("other.test", "127.0.0.41"),
		a("t1.test", "127.0.0.1"), a("t1.test", "127.0.0.2"), a("t1.test", "127.0.0.3"), a("t1.test", "127.0.0.4")})
	d.set(dnsKey{fqdn("t2.test"), dns.TypeA}, []dns.RR{
		&dns.CNAME{Hdr: dns.RR_Header{Name: fqdn("t2.test"), Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 5}, Target: fqdn("pod.t2.test")},
		a("pod.t2.test", "127.0.0.9")})
	r := newTargetResolver(d.addr, nil)
	ctx := context.Background()
	for name, want := range map[string]string{"t1.test.": "[127.0.0.1 127.0.0.2 127.0.0.3]", "t2.test.": "[127.0.0.9]"} {
		ips, err := r.lookup4(ctx, name, targetQuery{want: 3, maxAddrs: 3})
		if got := fmt.Sprint(ips); err != nil || got != want {
			t.Errorf("%s: %s, %v; want %s", name, got, err, want)
		}
	}
	if _, err := r.lookup4(ctx, "none.test.", targetQuery{want: 3, maxAddrs: 3}); !isNotFound(err) {
		t.Errorf("a target without records: %v, want not found", err)
	}
	d.failWith(dns.RcodeServerFailure)
	if _, err := r.lookup4(ctx, "t1.test.", targetQuery{want: 3, maxAddrs: 3}); err == nil || isNotFound(err) {
		t.Errorf("a failing server: %v, want a failure", err)
	}
}

// BenchmarkSRVTargetsOfManyAddresses looks up 16 targets of 1,000
// addresses each: with Go's resolver, which sorts each answer's addresses
// by RFC 6724 (a socket per address), and with the target resolver.
func BenchmarkSRVTargetsOfManyAddresses(b *testing.B) {
	d := startTestDNS(b)
	recs := make([]srvRecord, 16)
	for t := range recs {
		ips := make([]string, 1000)
		for i := range ips {
			ips[i] = fmt.Sprintf("10.%d.%d.%d", t, i>>8&255, i&255)
		}
		recs[t] = srvRecord{target: fmt.Sprintf("pod%d.test", t), port: 8000}
		d.setA(recs[t].target, ips...)
	}
	goResolver := newResolver(d.addr)
	ctx := context.Background()
	b.Run("go resolver", func(b *testing.B) {
		for b.Loop() {
			for _, rec := range recs {
				if ips, err := goResolver.LookupNetIP(ctx, "ip4", rec.target+"."); err != nil || len(ips) != 1000 {
					b.Fatal(len(ips), err)
				}
			}
		}
	})
	tr := newTargetResolver(d.addr, goResolver)
	b.Run("target resolver", func(b *testing.B) {
		for b.Loop() {
			if addrs, failed, _ := lookupTargets(ctx, tr, recs, 256, knownServers{}); failed != nil || len(addrs[15]) == 0 {
				b.Fatal(failed)
			}
		}
	})
}

// TestLookupTargetsShareMaxWorkers: the targets' addresses are
// max_workers in all, each target its share, not max_workers each (256
// targets of 4,000 took 287 MB and a quarter of a core a resolution).
func TestLookupTargetsShareMaxWorkers(t *testing.T) {
	d := startTestDNS(t)
	recs := []srvRecord{{target: "a.share.test", port: 1}, {target: "b.share.test", port: 2}}
	d.setA("a.share.test", "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5")
	d.setA("b.share.test", "10.0.1.1", "10.0.1.2", "10.0.1.3", "10.0.1.4", "10.0.1.5")
	addrs, failed, _ := lookupTargets(context.Background(), newTargetResolver(d.addr, nil), recs, 4, knownServers{})
	if failed != nil || len(addrs[0]) != 2 || len(addrs[1]) != 2 {
		t.Fatalf("addresses %v, failed %v; want 2 a target", addrs, failed)
	}
	// A share a record: one target under four ports gets one address a
	// record (a share a target built 256 ports × 256 addresses).
	ports := []srvRecord{{"a.share.test", 1}, {"a.share.test", 2}, {"a.share.test", 3}, {"a.share.test", 4}}
	if addrs, _, _ := lookupTargets(context.Background(), newTargetResolver(d.addr, nil), ports, 4, knownServers{}); len(addrs[0]) != 1 || len(addrs[3]) != 1 {
		t.Fatalf("one target under four ports: %v, want one address a record", addrs)
	}
	// A truncated UDP answer holding less than the share is asked again
	// over TCP: a target of 300 addresses in rotation flapped between the
	// 254 each UDP answer held.
	many := make([]string, 300)
	for i := range many {
		many[i] = fmt.Sprintf("10.1.%d.%d", i/200, i%200+1)
	}
	d.setA("big.share.test", many...)
	big := []srvRecord{{"big.share.test", 1}}
	if addrs, failed, _ := lookupTargets(context.Background(), newTargetResolver(d.addr, nil), big, 512, knownServers{}); failed != nil || len(addrs[0]) != 300 {
		t.Fatalf("300 addresses, share 512: %d read, failed %v", len(addrs[0]), failed)
	}
}

// TestLookupTargetsPassOnAndKeepKnown: a share a record leaves unused goes
// to the others (a single-pod target beside one of five addresses, at
// max_workers 4, cut the second to 2 with a place empty), and within its
// share a target keeps the addresses the name holds on the record's port
// before the answer's first (which rotate).
func TestLookupTargetsPassOnAndKeepKnown(t *testing.T) {
	d := startTestDNS(t)
	d.setA("one.keep.test", "10.0.2.1")
	d.setA("five.keep.test", "10.0.3.1", "10.0.3.2", "10.0.3.3", "10.0.3.4", "10.0.3.5")
	recs := []srvRecord{{target: "five.keep.test", port: 7}, {target: "one.keep.test", port: 7}}
	r := newTargetResolver(d.addr, nil)
	addrs, failed, _ := lookupTargets(context.Background(), r, recs, 4, knownServers{})
	if got := fmt.Sprint(addrs); failed != nil || got != "[[10.0.3.1 10.0.3.2 10.0.3.3] [10.0.2.1]]" {
		t.Fatalf("addresses %s, failed %v; want the single pod's unused place passed on", got, failed)
	}
	held := func(ips ...string) map[netip.Addr]bool {
		m := map[netip.Addr]bool{}
		for _, ip := range ips {
			m[netip.MustParseAddr(ip)] = true
		}
		return m
	}
	ep := netip.MustParseAddrPort
	known := knownServers{endpoints: map[netip.AddrPort]bool{ep("10.0.3.5:7"): true, ep("10.0.3.4:7"): true, ep("10.0.3.1:8"): true},
		targets: map[string]map[netip.Addr]bool{"five.keep.test": held("10.0.3.5", "10.0.3.4", "10.0.3.1")}}
	addrs, _, _ = lookupTargets(context.Background(), r, recs, 4, known)
	if got := fmt.Sprint(addrs[0]); got != "[10.0.3.4 10.0.3.5 10.0.3.1]" {
		t.Fatalf("the five-address target kept %s; want the two it holds on port 7 first", got)
	}
}

// heldAfter is what a name holds once the addresses lookupTargets gave
// recs are its workers, as the ledger's known reports it.
func heldAfter(recs []srvRecord, addrs [][]netip.Addr) knownServers {
	k := knownServers{endpoints: map[netip.AddrPort]bool{}, targets: map[string]map[netip.Addr]bool{}}
	for i, rec := range recs {
		if k.targets[rec.target] == nil {
			k.targets[rec.target] = map[netip.Addr]bool{}
		}
		for _, ip := range addrs[i] {
			k.endpoints[netip.AddrPortFrom(ip, rec.port)] = true
			k.targets[rec.target][ip] = true
		}
	}
	return k
}

// TestLookupTargetsKeepARotatingTargetsWorkers: a target answering more
// addresses than a UDP answer holds, in rotation (as round-robin servers
// do), keeps the workers the name holds of it: the truncated answer
// lacking some of them is asked again over TCP. Read from the UDP answer
// alone, two targets of 1,000 addresses each kept 6 % of their workers an
// answer at max_workers 256. And a target aliasing another's addresses,
// or answering unusable ones, takes no share that would go empty.
func TestLookupTargetsKeepARotatingTargetsWorkers(t *testing.T) {
	d := startTestDNS(t)
	for n, name := range []string{"a.rot.test", "b.rot.test"} {
		ips := make([]string, 1000)
		for i := range ips {
			ips[i] = fmt.Sprintf("10.%d.%d.%d", 10+n, i/200, i%200+1)
		}
		d.setA(name, ips...)
	}
	d.setRotating(true)
	r := newTargetResolver(d.addr, nil)
	recs := []srvRecord{{target: "a.rot.test", port: 8000}, {target: "b.rot.test", port: 8000}}
	var known knownServers
	for round := range 6 {
		addrs, failed, _ := lookupTargets(context.Background(), r, recs, 256, known)
		if failed != nil || len(addrs[0])+len(addrs[1]) != 256 {
			t.Fatalf("round %d: %d + %d addresses, failed %v; want 256", round, len(addrs[0]), len(addrs[1]), failed)
		}
		next := heldAfter(recs, addrs)
		kept := 0
		for ep := range next.endpoints {
			if known.endpoints[ep] {
				kept++
			}
		}
		if round > 0 && kept != 256 {
			t.Fatalf("round %d kept %d of the 256 workers the name held", round, kept)
		}
		known = next
	}

	d.setRotating(false)
	d.setA("alias.rot.test", "10.0.9.1", "10.0.9.2", "10.0.9.3", "10.0.9.4")
	d.setA("same.rot.test", "10.0.9.1", "10.0.9.2", "10.0.9.3", "10.0.9.4")
	d.setA("linklocal.rot.test", "169.254.0.1", "169.254.0.2", "169.254.0.3", "169.254.0.4")
	d.setA("other.rot.test", "10.0.8.1", "10.0.8.2", "10.0.8.3", "10.0.8.4")
	recs = []srvRecord{{"alias.rot.test", 1}, {"linklocal.rot.test", 1}, {"other.rot.test", 1}, {"same.rot.test", 1}}
	addrs, _, unusable := lookupTargets(context.Background(), r, recs, 6, knownServers{})
	if got := fmt.Sprint(addrs); got != "[[10.0.9.1 10.0.9.2 10.0.9.3] [] [10.0.8.1 10.0.8.2 10.0.8.3] []]" || unusable != 4 {
		t.Fatalf("addresses %s, %d unusable; want the alias and the link-local target to take no share, and its 4 counted",
			got, unusable)
	}
	// A pod whose one address a larger target also answers keeps it,
	// where the larger target's share would have left it out.
	d.setA("pod.rot.test", "10.0.8.4")
	d.setA("third.rot.test", "10.0.6.1", "10.0.6.2", "10.0.6.3", "10.0.6.4")
	recs = []srvRecord{{"other.rot.test", 1}, {"pod.rot.test", 1}, {"third.rot.test", 1}}
	addrs, _, _ = lookupTargets(context.Background(), r, recs, 4, knownServers{})
	if got := fmt.Sprint(addrs); got != "[[10.0.8.1 10.0.8.2] [10.0.8.4] [10.0.6.1]]" {
		t.Fatalf("addresses %s; want the pod to keep its address", got)
	}
}

// TestLookupTargetsKeepAnEndpointsTarget: an endpoint two targets answer
// stays with the target the name holds it under when the targets' sizes
// change: moved, its event and replay ports would follow the other
// target's sibling records.
func TestLookupTargetsKeepAnEndpointsTarget(t *testing.T) {
	d := startTestDNS(t)
	d.setA("x.move.test", "10.5.0.1", "10.5.0.2", "10.5.0.3")
	d.setA("y.move.test", "10.5.0.3", "10.5.0.4")
	r := newTargetResolver(d.addr, nil)
	recs := []srvRecord{{"x.move.test", 8000}, {"y.move.test", 8000}}
	addrs, _, _ := lookupTargets(context.Background(), r, recs, 10, knownServers{})
	if got := fmt.Sprint(addrs); got != "[[10.5.0.1 10.5.0.2] [10.5.0.3 10.5.0.4]]" {
		t.Fatalf("first answer: %s", got)
	}
	known := heldAfter(recs, addrs)
	d.setA("y.move.test", "10.5.0.3", "10.5.0.4", "10.5.0.5", "10.5.0.6")
	addrs, _, _ = lookupTargets(context.Background(), r, recs, 10, known)
	if got := fmt.Sprint(addrs); got != "[[10.5.0.1 10.5.0.2] [10.5.0.3 10.5.0.4 10.5.0.5 10.5.0.6]]" {
		t.Fatalf("y grown: %s; want 10.5.0.3 to stay y's", got)
	}
}

// TestLookupTargetsBoundTheirTCPReads: targets answering thousands in
// rotation are read again over TCP for their held addresses a few a
// resolution, not each (256 such targets cost 280 MB and 0.4 s a
// refresh); and where TCP/53 is blocked, a truncated UDP answer is used
// as it is rather than failing its target, whose workers, stale ones
// included, would otherwise stay for good.
func TestLookupTargetsBoundTheirTCPReads(t *testing.T) {
	d := startTestDNS(t)
	recs := make([]srvRecord, 20)
	for n := range recs {
		recs[n] = srvRecord{target: fmt.Sprintf("t%d.tcp.test", n), port: 8000}
		ips := make([]string, 1000)
		for i := range ips {
			ips[i] = fmt.Sprintf("10.%d.%d.%d", 100+n, i/200, i%200+1)
		}
		d.setA(recs[n].target, ips...)
	}
	d.setRotating(true)
	r := newTargetResolver(d.addr, nil)
	within := time.Minute
	resolve := func(known knownServers) ([][]netip.Addr, map[string]bool, knownServers) {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		addrs, failed, _ := lookupTargets(ctx, r, recs, 256, known)
		return addrs, failed, heldAfter(recs, addrs)
	}
	_, _, known := resolve(knownServers{})
	for round := range 3 {
		before := d.tcp.Load()
		_, failed, next := resolve(known)
		if n := d.tcp.Load() - before; failed != nil || n > maxHeldRereads {
			t.Fatalf("round %d: %d TCP reads for 20 targets, failed %v; want at most %d", round, n, failed, maxHeldRereads)
		}
		known = next
	}
	d.setNoTCP(true)
	addrs, failed, _ := resolve(known)
	total := 0
	for _, a := range addrs {
		total += len(a)
	}
	if failed != nil || total != 256 {
		t.Fatalf("TCP blocked: %d addresses, failed targets %v; want the UDP answers' 256", total, failed)
	}
	// TCP dropped, not refused, within a refresh of 1 s: a read that held
	// to the resolution's end held one of the few lookups at once with
	// it, and the targets waiting for one failed (18 of 20).
	d.setNoTCP(false)
	d.setTCPMute(true)
	within = time.Second
	addrs, failed, _ = resolve(known)
	total = 0
	for _, a := range addrs {
		total += len(a)
	}
	if failed != nil || total != 256 {
		t.Fatalf("TCP dropped: %d addresses, failed targets %v; want the UDP answers' 256", total, failed)
	}
}

// TestShareOut: even shares, what a record cannot fill divided again
// among those that can, the remainder to the first in record order, and
// never more than a record can fill or than the total.
func TestShareOut(t *testing.T) {
	for _, c := range []struct {
		counts []int
		total  int
		want   string
	}{
		{[]int{5, 5}, 4, "[2 2]"},
		{[]int{5, 1}, 4, "[3 1]"},
		{[]int{1, 1}, 4, "[1 1]"},
		{[]int{9, 0, 9}, 5, "[3 0 2]"},
		{[]int{2, 9, 9, 1}, 10, "[2 4 3 1]"},
		{[]int{3, 3, 3}, 2, "[1 1 0]"},
		{nil, 4, "[]"},
	} {
		if got := fmt.Sprint(shareOut(c.counts, c.total)); got != c.want {
			t.Errorf("shareOut(%v, %d) = %s, want %s", c.counts, c.total, got, c.want)
		}
	}
}

// TestSiblingGraceIsTheSiblings: a sibling port is held for the sibling
// name it came from; another name (a reload that renames it), or none,
// starts afresh.
func TestSiblingGraceIsTheSiblings(t *testing.T) {
	var g siblingGrace
	port := func(s *workerSpec) *uint16 { return &s.eventsPort }
	g.hold("kv-events", []workerSpec{{target: "a", eventsPort: 6001}}, port)
	specs := []workerSpec{{target: "a"}}
	g.hold("kv-new", specs, port)
	if specs[0].eventsPort != 0 {
		t.Fatalf("the old sibling's port %d held for the new one", specs[0].eventsPort)
	}
	g.hold("kv-new", []workerSpec{{target: "a", eventsPort: 7001}}, port)
	g.hold("", []workerSpec{{target: "a"}}, port)
	specs = []workerSpec{{target: "a"}}
	g.hold("kv-new", specs, port)
	if specs[0].eventsPort != 0 {
		t.Fatalf("a port from before events were off held: %d", specs[0].eventsPort)
	}
}
