// Package kvrouter is the module root, so that builders which import a
// plugin by its module path (xcaddy --with github.com/kvrouter/caddy-kvrouter)
// get every caddy-kvrouter Caddy module.
package kvrouter

import (
	_ "github.com/kvrouter/caddy-kvrouter/caddymodule"
)
