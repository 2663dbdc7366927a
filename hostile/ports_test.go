package hostile

// deadEndpoint is a loopback address nothing listens on (port 1 is
// privileged and unused): workers that must be in the catalog but are
// never reached, by HTTP or by a KV-event subscriber, point there.
const deadEndpoint = "127.0.0.1:1"
