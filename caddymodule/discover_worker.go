package caddymodule

import (
	"net/netip"
	"strconv"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// workerSpec is what discovery registers for one server found under a
// name: its address and ports from DNS, the rest from the name's entry.
// It is comparable, so a refresh rewrites a worker only when it changed.
type workerSpec struct {
	ip         netip.Addr
	httpPort   uint16
	eventsPort uint16 // 0: no KV-event endpoint
	replayPort uint16 // 0: no replay endpoint
	target     string // the SRV target it was found at, or ""
	model      string
	group      string
	blockSize  uint32
	dpSize     uint32
}

// addrPort is the worker's HTTP endpoint.
func (s *workerSpec) addrPort() netip.AddrPort {
	return netip.AddrPortFrom(s.ip, s.httpPort)
}

// endpoint is the worker's HTTP endpoint, ip:port.
func (s *workerSpec) endpoint() string {
	return s.addrPort().String()
}

// zmqEndpoint is tcp://ip:port.
func (s *workerSpec) zmqEndpoint(port int) string {
	return "tcp://" + netip.AddrPortFrom(s.ip, uint16(port)).String()
}

// request is the catalog upsert for the worker: the fields a worker
// declared in the Caddyfile would give (WorkerConfig.request, so the app's
// block_size is the default here too), with one KV-event endpoint per rank
// for a worker with several.
func (s *workerSpec) request(id uint64, defaultBlockSize uint32) *selection.WorkerRequest {
	w := WorkerConfig{WorkerID: &id, ModelName: s.model, RoutingGroup: s.group, Endpoint: s.endpoint(),
		BlockSize: s.blockSize, DataParallelSize: s.dpSize}
	if s.eventsPort != 0 && s.dpSize == 1 {
		w.KVEventsEndpoint = s.zmqEndpoint(int(s.eventsPort))
	}
	if s.replayPort != 0 && s.dpSize == 1 {
		w.ReplayEndpoint = s.zmqEndpoint(int(s.replayPort))
	}
	req := w.request(defaultBlockSize)
	if s.eventsPort != 0 && s.dpSize > 1 {
		// vLLM's rank r publishes on the configured port + r; the
		// settings checked that the last one is a port.
		req.KVEventsEndpoints = make(map[string]string, s.dpSize)
		for r := range s.dpSize {
			req.KVEventsEndpoints[strconv.FormatUint(uint64(r), 10)] = s.zmqEndpoint(int(s.eventsPort) + int(r))
		}
	}
	return req
}
