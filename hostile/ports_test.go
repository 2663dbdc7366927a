package hostile

import "net"

// freePorts returns n distinct TCP ports on 127.0.0.1 that were free a
// moment ago: all n are held open together (so they differ), then
// released for the gateway to bind. Another process can take one in
// between; startGateway retries with new ports when a bind fails.
func freePorts(n int) ([]int, error) {
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// deadEndpoint is a loopback address nothing listens on (port 1 is
// privileged and unused): workers that must be in the catalog but are
// never reached, by HTTP or by a KV-event subscriber, point there.
const deadEndpoint = "127.0.0.1:1"
