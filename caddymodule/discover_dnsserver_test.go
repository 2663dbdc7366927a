package caddymodule

import (
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/miekg/dns"
)

// testDNS is an authoritative DNS server for the discovery tests, on
// 127.0.0.1: UDP and TCP on one OS-chosen port (an answer too large for
// the client's UDP size is truncated, and Go's resolver asks again over
// TCP, as with a real server). It answers from records the test changes;
// a name it has no record of is NXDOMAIN, a known name without records of
// the type asked is an empty NOERROR answer.
type testDNS struct {
	addr    string
	servers []*dns.Server

	mu      sync.Mutex
	records map[dnsKey][]dns.RR
	rcode   int            // when not 0, every query gets it (dns.RcodeServerFailure, say)
	failing map[string]int // names whose queries get this rcode
	silent  bool           // when set, queries get no answer at all
	rotate  bool           // when set, each answer starts 257 records further on: another window of a large set, as shuffling servers give
	turns   int            // answers rotated so far
	noTCP   bool           // when set, TCP queries get their connection closed (TCP/53 blocked)
	tcpMute bool           // when set, TCP queries get no answer (TCP/53 dropped by a firewall)
	queries atomic.Int64
	tcp     atomic.Int64  // queries over TCP
	asked   chan struct{} // a query arrived (buffered: one pending signal)
}

// dnsKey is a record set's owner name (lower case, absolute) and type.
type dnsKey struct {
	name  string
	rtype uint16
}

// startTestDNS starts the server; the test's cleanup stops it.
func startTestDNS(t testing.TB) *testDNS {
	t.Helper()
	s := &testDNS{records: map[dnsKey][]dns.RR{}, asked: make(chan struct{}, 1)}
	var pc net.PacketConn
	var ln net.Listener
	for attempt := 0; ln == nil; attempt++ {
		var err error
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		// The same port over TCP, free unless something else took it.
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err != nil {
			pc.Close()
			if attempt == 10 {
				t.Fatalf("no UDP and TCP port pair free on 127.0.0.1: %v", err)
			}
		}
	}
	s.addr = pc.LocalAddr().String()
	var started sync.WaitGroup
	for _, srv := range []*dns.Server{{PacketConn: pc}, {Listener: ln}} {
		srv.Handler = dns.HandlerFunc(s.serve)
		started.Add(1)
		srv.NotifyStartedFunc = started.Done
		s.servers = append(s.servers, srv)
		go func() { _ = srv.ActivateAndServe() }()
	}
	started.Wait()
	t.Cleanup(func() {
		for _, srv := range s.servers {
			_ = srv.Shutdown()
		}
	})
	return s
}

// fqdn is the server's form of a name.
func fqdn(name string) string { return dns.Fqdn(strings.ToLower(name)) }

// setA replaces name's A records.
func (s *testDNS) setA(name string, ips ...string) {
	rrs := make([]dns.RR, 0, len(ips))
	for _, ip := range ips {
		rrs = append(rrs, &dns.A{Hdr: dns.RR_Header{Name: fqdn(name), Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5},
			A: net.ParseIP(ip).To4()})
	}
	s.set(dnsKey{fqdn(name), dns.TypeA}, rrs)
}

// setAAAA replaces name's AAAA records.
func (s *testDNS) setAAAA(name string, ips ...string) {
	rrs := make([]dns.RR, 0, len(ips))
	for _, ip := range ips {
		rrs = append(rrs, &dns.AAAA{Hdr: dns.RR_Header{Name: fqdn(name), Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 5},
			AAAA: net.ParseIP(ip)})
	}
	s.set(dnsKey{fqdn(name), dns.TypeAAAA}, rrs)
}

// srvTo is one SRV record's target and port.
type srvTo struct {
	target string
	port   uint16
}

// setSRV replaces name's SRV records.
func (s *testDNS) setSRV(name string, recs ...srvTo) {
	rrs := make([]dns.RR, 0, len(recs))
	for i, r := range recs {
		rrs = append(rrs, &dns.SRV{Hdr: dns.RR_Header{Name: fqdn(name), Rrtype: dns.TypeSRV, Class: dns.ClassINET, Ttl: 5},
			Priority: 0, Weight: uint16(10 + i), Port: r.port, Target: fqdn(r.target)})
	}
	s.set(dnsKey{fqdn(name), dns.TypeSRV}, rrs)
}

// set replaces a record set; no records removes the name's records of
// that type.
func (s *testDNS) set(k dnsKey, rrs []dns.RR) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(rrs) == 0 {
		delete(s.records, k)
		return
	}
	s.records[k] = rrs
}

// failWith makes every query answer rcode (0: answer normally).
func (s *testDNS) failWith(rcode int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rcode = rcode
}

// failName makes the queries for name answer rcode (0: answer normally).
func (s *testDNS) failName(name string, rcode int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failing == nil {
		s.failing = map[string]int{}
	}
	s.failing[fqdn(name)] = rcode
}

// locked runs f under the server's lock: the setters below change how
// it answers.
func (s *testDNS) locked(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
}

// setNoTCP closes every TCP query's connection (TCP/53 blocked), or not.
func (s *testDNS) setNoTCP(blocked bool) { s.locked(func() { s.noTCP = blocked }) }

// setTCPMute leaves TCP queries unanswered (TCP/53 dropped), or not.
func (s *testDNS) setTCPMute(mute bool) { s.locked(func() { s.tcpMute = mute }) }

// setRotating starts each answer further on in its records, or not.
func (s *testDNS) setRotating(rotate bool) { s.locked(func() { s.rotate = rotate }) }

// setSilent makes the server drop every query (or answer again).
func (s *testDNS) setSilent(silent bool) { s.locked(func() { s.silent = silent }) }

func (s *testDNS) serve(w dns.ResponseWriter, r *dns.Msg) {
	s.queries.Add(1)
	if w.LocalAddr().Network() == "tcp" {
		s.tcp.Add(1)
		s.mu.Lock()
		blocked, mute := s.noTCP, s.tcpMute
		s.mu.Unlock()
		switch {
		case blocked:
			_ = w.Close()
			return
		case mute:
			return
		}
	}
	select {
	case s.asked <- struct{}{}:
	default:
	}
	s.mu.Lock()
	silent, rcode := s.silent, s.rcode
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	if len(r.Question) == 1 && rcode == 0 {
		rcode = s.failing[strings.ToLower(r.Question[0].Name)]
	}
	if rcode == 0 && len(r.Question) == 1 {
		q := r.Question[0]
		name := strings.ToLower(q.Name)
		rrs := s.records[dnsKey{name, q.Qtype}]
		if s.rotate && len(rrs) > 0 {
			s.turns++
			k := s.turns * 257 % len(rrs)
			m.Answer = append(append(m.Answer, rrs[k:]...), rrs[:k]...)
		} else {
			m.Answer = append(m.Answer, rrs...)
		}
		if len(m.Answer) == 0 && !s.knowsLocked(name) {
			m.Rcode = dns.RcodeNameError
		}
	} else if rcode != 0 {
		m.Rcode = rcode
	}
	s.mu.Unlock()
	if silent {
		return
	}
	size := dns.MaxMsgSize
	if w.LocalAddr().Network() == "udp" {
		size = dns.MinMsgSize
		if opt := r.IsEdns0(); opt != nil {
			size = int(opt.UDPSize())
		}
	}
	m.Truncate(size)
	_ = w.WriteMsg(m)
}

// knowsLocked reports whether name has records of any type.
func (s *testDNS) knowsLocked(name string) bool {
	for k := range s.records {
		if k.name == name {
			return true
		}
	}
	return false
}
