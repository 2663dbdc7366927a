# Builds the same gateway with xcaddy instead of cmd/caddy:
#   make -f xcaddy.mk
# xcaddy forces CGO_ENABLED=0 unless it is exported, and zmq4 needs cgo; the
# local module is pinned at v0.0.0 so xcaddy does not ask the proxy for it.

GO            ?= go
CADDY_VERSION ?= v2.11.9
XCADDY        ?= $(shell $(GO) env GOPATH)/bin/xcaddy
export CGO_ENABLED := 1

.PHONY: xcaddy-build
xcaddy-build: $(XCADDY)
	$(XCADDY) build $(CADDY_VERSION) \
		--with github.com/kvrouter/caddy-kvrouter@v0.0.0=. \
		--output bin/caddy-xcaddy

$(XCADDY):
	$(GO) install github.com/caddyserver/xcaddy/cmd/xcaddy@v0.4.5
