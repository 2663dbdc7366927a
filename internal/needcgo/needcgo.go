//go:build !cgo

package needcgo

// The constant's type cannot hold its value, so the compiler refuses it and
// prints the string: that is the message a builder without cgo sees.
const _ bool = "caddy-kvrouter needs cgo and libzmq: set CGO_ENABLED=1 and install libzmq3-dev and pkg-config (apt-get install -y libzmq3-dev pkg-config)"
