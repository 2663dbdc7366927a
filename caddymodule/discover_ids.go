package caddymodule

import (
	"crypto/sha256"
	"encoding/binary"
	"strings"
)

// Discovered workers' ids (docs/discovery.md). A worker found under a name
// at an HTTP endpoint gets the id
//
//	2^62 | (the first 62 bits of SHA-256("kvrouter discovery\x00" + name + "\x00" + endpoint))
//
// with the name lower-cased without its trailing dot and the endpoint as
// ip:port ([ip]:port for IPv6). So the same server found again, by this
// gateway after a refresh, a reload or a restart, or by another replica,
// has the same id; and every discovered id lies in [2^62, 2^63): above the
// ids people pick by hand, and still a positive signed 64-bit integer for
// clients that read ids as such. Discovery never takes over an id, nor an
// endpoint, that a worker it did not create holds.

// discoveredIDBit is set in every discovered id; the bit above it is not.
const discoveredIDBit = uint64(1) << 62

// discoveredID is the id of the worker found under name at endpoint.
func discoveredID(name, endpoint string) uint64 {
	h := sha256.Sum256([]byte("kvrouter discovery\x00" + canonicalName(name) + "\x00" + endpoint))
	return discoveredIDBit | binary.BigEndian.Uint64(h[:8])&(discoveredIDBit-1)
}

// canonicalName is how a DNS name is compared: case-insensitive, with or
// without its trailing dot.
func canonicalName(name string) string {
	return strings.TrimSuffix(strings.ToLower(name), ".")
}
