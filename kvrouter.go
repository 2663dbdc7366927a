// Package kvrouter is the module root, so that builders which import a
// plugin by its module path (xcaddy --with github.com/kvrouter/caddy-kvrouter)
// get every caddy-kvrouter Caddy module.
package kvrouter

import (
	// First, so that a build with cgo off says what it needs (cgo and
	// libzmq) beside the errors of the ZMQ binding.
	_ "github.com/kvrouter/caddy-kvrouter/internal/needcgo"

	_ "github.com/kvrouter/caddy-kvrouter/caddymodule"
)
