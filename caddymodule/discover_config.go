package caddymodule

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// DiscoveryConfig is how the kv_router app finds workers through DNS
// (docs/discovery.md): the records of each name, for example a Kubernetes
// headless Service, become catalog workers, re-resolved periodically. The
// field sits at the top level of the kv_router app (the struct is
// embedded).
type DiscoveryConfig struct {
	// Discover lists the names to follow, one entry per `discover dns`
	// subdirective; a name may be given once. Default: none.
	Discover []DNSDiscovery `json:"discover,omitempty"`
}

// DNSDiscovery turns the records of one DNS name into catalog workers: one
// worker per address found (per SRV record's target and port), added when
// it appears, updated when this entry changes, deleted when its record has
// gone away.
type DNSDiscovery struct {
	// DNS is the name to resolve, for example "vllm.llm.svc.cluster.local"
	// or, for SRV records, "_http._tcp.vllm.llm.svc.cluster.local". A name
	// without a trailing dot goes through the resolver's search list.
	// Required.
	DNS string `json:"dns"`

	// Type is the record type read: "a" (IPv4 addresses), "aaaa" (IPv6
	// addresses) or "srv" (a target and a port per record; the targets'
	// IPv4 addresses are looked up). Default: "srv" for a name whose first
	// label starts with "_", "a" otherwise.
	Type string `json:"type,omitempty"`

	// HTTPPort is the HTTP port of the workers found through A or AAAA
	// records; an SRV record carries its own, so it is refused with "srv".
	// Default: 8000, vLLM's.
	HTTPPort int `json:"http_port,omitempty"`

	// KVEventsPort is the port of each worker's KV-event publisher: its
	// kv_events endpoint is tcp://<address>:<port>, and rank r of a worker
	// with several data-parallel ranks publishes on port+r, as vLLM numbers
	// them. 0 means no endpoint. Default: 5557, vLLM's.
	KVEventsPort *int `json:"kv_events_port,omitempty"`

	// ReplayPort is the port of each worker's replay socket. 0 means none.
	// The catalog takes a replay endpoint for a one-rank worker only, so
	// it is refused with a data_parallel_size above 1. Default: 5657 (the
	// port docs/vllm.md uses), none with a data_parallel_size above 1.
	ReplayPort *int `json:"replay_port,omitempty"`

	// KVEventsSRV, with SRV records, names the Service port whose SRV
	// records give each target's KV-event port: for
	// _http._tcp.vllm.llm.svc.cluster.local and "kv-events", the records of
	// _kv-events._tcp.vllm.llm.svc.cluster.local, matched by target. A
	// target they do not list gets no KV-event endpoint. It replaces
	// kv_events_port. Default: unset (kv_events_port is used).
	KVEventsSRV string `json:"kv_events_srv,omitempty"`

	// ReplaySRV is KVEventsSRV for the replay port; it replaces
	// replay_port. Default: unset (replay_port is used).
	ReplaySRV string `json:"replay_srv,omitempty"`

	// Refresh is how often the name is resolved again. At least 1s.
	// Default: 10s.
	Refresh caddy.Duration `json:"refresh,omitempty"`

	// Resolver is the DNS server asked, as host:port (the port defaults to
	// 53). Default: the name servers of /etc/resolv.conf, asked by Go's
	// resolver.
	Resolver string `json:"resolver,omitempty"`

	// ModelName is the model the workers are registered with. Default:
	// none given, so engine facts set it to the model the engine serves
	// ("default" until they have read it).
	ModelName string `json:"model_name,omitempty"`

	// RoutingGroup is the routing group of the workers within their model.
	// Default: "default".
	RoutingGroup string `json:"routing_group,omitempty"`

	// BlockSize is the workers' KV block size in tokens. Default: the
	// app's block_size or, without one, the engine's, read by engine
	// facts.
	BlockSize uint32 `json:"block_size,omitempty"`

	// DataParallelSize is the number of data-parallel ranks each worker
	// serves behind its one HTTP port, each scheduled on its own, with
	// KV-event ports kv_events_port+rank. Default: 1.
	DataParallelSize uint32 `json:"data_parallel_size,omitempty"`

	// MaxWorkers bounds the workers this name may hold. A DNS answer is
	// data from elsewhere: past the bound, the addresses the name does not
	// already hold are left out (the lowest kept), with a warning and
	// kvrouter_discovery_skipped_total{reason="over_max_workers"}.
	// Default: 256.
	MaxWorkers int `json:"max_workers,omitempty"`
}

// Defaults and bounds of a discovered name.
const (
	defaultDiscoveryHTTPPort   = 8000
	defaultDiscoveryEventsPort = 5557
	defaultDiscoveryReplayPort = 5657
	defaultDiscoveryRefresh    = 10 * time.Second
	minDiscoveryRefresh        = time.Second
	defaultDiscoveryMaxWorkers = 256
	// maxDiscoveryMaxWorkers is the catalog's own default bound: one name
	// cannot be allowed more than the whole catalog holds by default.
	maxDiscoveryMaxWorkers = 65536
)

// Record types a name is read as.
const (
	recordA    = "a"
	recordAAAA = "aaaa"
	recordSRV  = "srv"
)

// dnsSettings are one entry with its defaults filled in and checked.
type dnsSettings struct {
	name       string // as configured: what is resolved, and the metrics' label
	key        string // canonicalName(name): what the ledger and the ids know it by
	recordType string
	httpPort   uint16 // A and AAAA only
	eventsPort uint16 // 0: none
	replayPort uint16 // 0: none
	eventsSRV  string // the sibling SRV name giving event ports, or ""
	replaySRV  string // the sibling SRV name giving replay ports, or ""
	refresh    time.Duration
	resolver   string // host:port, or "" for the system's
	model      string
	group      string
	blockSize  uint32
	dpSize     uint32
	maxWorkers int
}

// validate checks every entry, and that no name is given twice: two
// entries for one name would fight over its workers.
func (c *DiscoveryConfig) validate() error {
	_, err := c.settings()
	return err
}

// settings are the entries' settings, or the first entry's error.
func (c *DiscoveryConfig) settings() ([]dnsSettings, error) {
	out := make([]dnsSettings, 0, len(c.Discover))
	seen := map[string]bool{}
	for i := range c.Discover {
		s, err := c.Discover[i].settings()
		if err != nil {
			return nil, fmt.Errorf("discover dns %s: %v", c.Discover[i].DNS, err)
		}
		if seen[s.key] {
			return nil, fmt.Errorf("discover dns %s: the name is given twice", s.name)
		}
		seen[s.key] = true
		out = append(out, s)
	}
	return out, nil
}

// settings fills in the entry's defaults and checks it.
func (e *DNSDiscovery) settings() (dnsSettings, error) {
	s := dnsSettings{name: e.DNS, key: canonicalName(e.DNS), model: e.ModelName, group: e.RoutingGroup,
		blockSize: e.BlockSize, dpSize: max(e.DataParallelSize, 1)}
	if err := checkDNSName(e.DNS); err != nil {
		return s, err
	}
	switch t := strings.ToLower(e.Type); t {
	case "":
		s.recordType = recordA
		if strings.HasPrefix(e.DNS, "_") {
			s.recordType = recordSRV
		}
	case recordA, recordAAAA, recordSRV:
		s.recordType = t
	default:
		return s, fmt.Errorf("type must be a, aaaa or srv, not %q", e.Type)
	}

	var err error
	if s.recordType == recordSRV {
		if e.HTTPPort != 0 {
			return s, errors.New("http_port is for A and AAAA records: an SRV record carries the HTTP port")
		}
	} else if s.httpPort, err = portSetting("http_port", e.HTTPPort, defaultDiscoveryHTTPPort); err != nil {
		return s, err
	}
	if s.eventsPort, err = optionalPort("kv_events_port", e.KVEventsPort, defaultDiscoveryEventsPort); err != nil {
		return s, err
	}
	replayDefault := defaultDiscoveryReplayPort
	if s.dpSize > 1 {
		if (e.ReplayPort != nil && *e.ReplayPort != 0) || e.ReplaySRV != "" {
			return s, errors.New("a worker with several data-parallel ranks takes no replay endpoint")
		}
		replayDefault = 0
	}
	if s.replayPort, err = optionalPort("replay_port", e.ReplayPort, replayDefault); err != nil {
		return s, err
	}
	if s.eventsPort != 0 && int(s.eventsPort)+int(s.dpSize)-1 > 65535 {
		return s, fmt.Errorf("kv_events_port %d plus %d ranks is past port 65535", s.eventsPort, s.dpSize)
	}
	for _, sib := range []struct {
		option, portName, other string
		given                   bool
		name                    *string
		port                    *uint16
	}{
		{"kv_events_srv", e.KVEventsSRV, "kv_events_port", e.KVEventsPort != nil, &s.eventsSRV, &s.eventsPort},
		{"replay_srv", e.ReplaySRV, "replay_port", e.ReplayPort != nil, &s.replaySRV, &s.replayPort},
	} {
		if sib.portName == "" {
			continue
		}
		if sib.given {
			return s, fmt.Errorf("%s and %s are two sources for one port: give one", sib.option, sib.other)
		}
		if *sib.name, err = siblingSRVName(s.recordType, e.DNS, sib.portName); err != nil {
			return s, fmt.Errorf("%s: %v", sib.option, err)
		}
		*sib.port = 0
	}

	switch refresh := time.Duration(e.Refresh); {
	case refresh == 0:
		s.refresh = defaultDiscoveryRefresh
	case refresh < minDiscoveryRefresh:
		return s, fmt.Errorf("refresh must be at least %v, not %v", minDiscoveryRefresh, refresh)
	default:
		s.refresh = refresh
	}
	if s.resolver, err = resolverAddress(e.Resolver); err != nil {
		return s, err
	}
	switch {
	case e.MaxWorkers == 0:
		s.maxWorkers = defaultDiscoveryMaxWorkers
	case e.MaxWorkers < 0 || e.MaxWorkers > maxDiscoveryMaxWorkers:
		return s, fmt.Errorf("max_workers must be between 1 and %d, not %d", maxDiscoveryMaxWorkers, e.MaxWorkers)
	default:
		s.maxWorkers = e.MaxWorkers
	}
	return s, nil
}

// checkDNSName refuses what cannot be a DNS name: empty, too long, an
// empty label, or a space or control character.
func checkDNSName(name string) error {
	n := strings.TrimSuffix(name, ".")
	if n == "" {
		return errors.New("a DNS name is required")
	}
	if len(n) > 253 {
		return fmt.Errorf("the name is %d bytes long; a DNS name has at most 253", len(n))
	}
	for label := range strings.SplitSeq(n, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("%q is not a DNS name", name)
		}
	}
	if strings.ContainsFunc(n, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
		return fmt.Errorf("%q is not a DNS name", name)
	}
	return nil
}

// portSetting is a port option with a default for 0.
func portSetting(option string, v, def int) (uint16, error) {
	if v == 0 {
		return uint16(def), nil
	}
	if v < 1 || v > 65535 {
		return 0, fmt.Errorf("%s must be a port between 1 and 65535, not %d", option, v)
	}
	return uint16(v), nil
}

// optionalPort is a port option that may be off: nil is the default, 0
// is off.
func optionalPort(option string, v *int, def int) (uint16, error) {
	if v == nil {
		return uint16(def), nil
	}
	if *v == 0 {
		return 0, nil
	}
	return portSetting(option, *v, def)
}

// siblingSRVName is the SRV name of another port of the same Service:
// Kubernetes names a Service port's SRV records _<port>._<proto>.<service>,
// so the sibling replaces the name's first label.
func siblingSRVName(recordType, name, port string) (string, error) {
	if recordType != recordSRV {
		return "", errors.New("only an SRV name has sibling port names")
	}
	port = strings.TrimPrefix(port, "_")
	if port == "" || len(port) > 62 || strings.ContainsFunc(port, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-')
	}) {
		return "", fmt.Errorf("%q is not a port name (letters, digits and hyphens)", port)
	}
	first, rest, ok := strings.Cut(name, ".")
	if !ok || !strings.HasPrefix(first, "_") {
		return "", fmt.Errorf("the name %s does not start with a _<port> label to replace", name)
	}
	return "_" + port + "." + rest, nil
}

// resolverAddress checks a resolver option and gives it its port.
func resolverAddress(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	if host, port, err := net.SplitHostPort(s); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || host == "" {
			return "", fmt.Errorf("resolver %q is not host:port", s)
		}
		return s, nil
	}
	host := s
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		host = s[1 : len(s)-1] // [::1], as in [::1]:53
		if _, err := netip.ParseAddr(host); err != nil {
			return "", fmt.Errorf("resolver %q is not host:port", s)
		}
	}
	if _, err := netip.ParseAddr(host); err != nil && (strings.Contains(host, ":") || checkDNSName(host) != nil) {
		return "", fmt.Errorf("resolver %q is not host:port", s)
	}
	return net.JoinHostPort(host, "53"), nil
}
