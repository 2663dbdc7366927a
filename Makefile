# caddy-kvrouter — the two set-up commands are `make demo` and `make test`.
# Both install what is missing (libzmq, Go modules) and build bin/caddy.

GO      ?= go
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export CGO_ENABLED := 1

.PHONY: all deps build test test-unit test-race bench bench-proxy demo clean

all: build

# deps installs libzmq's headers and pkg-config when they are missing
# (Debian), then downloads the Go modules.
deps:
	@if ! pkg-config --exists libzmq 2>/dev/null; then \
		echo "installing libzmq3-dev and pkg-config"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq libzmq3-dev pkg-config; \
	fi
	$(GO) mod download

bin/caddy: deps $(shell find . -name '*.go' -not -path './bin/*') go.mod go.sum
	$(GO) build -o bin/caddy ./cmd/caddy

build: bin/caddy

bin/kvbench: $(shell find cmd/kvbench selection -name '*.go') go.mod
	$(GO) build -o bin/kvbench ./cmd/kvbench

# test: vet, every package's tests (the Caddy integration tests included),
# then the race detector over the concurrent packages.
test: deps build
	$(GO) vet ./...
	$(GO) test -count=1 ./...
	$(GO) test -race -count=1 ./selection/ ./indexer/

bench: deps
	$(GO) test -run '^$$' -bench . -benchtime 2s ./selection/

# bench-proxy: the proxy path against a plain reverse_proxy (BENCHMARKS.md).
bench-proxy: build bin/kvbench
	./scripts/bench-proxy.sh

demo: deps build bin/kvbench
	./scripts/demo.sh

clean:
	rm -rf bin
