// Command caddy is the caddy-kvrouter gateway: standard Caddy plus the
// kv_router modules.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/kvrouter/caddy-kvrouter/caddymodule"
)

func main() {
	caddycmd.Main()
}
