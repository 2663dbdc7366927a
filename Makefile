# caddy-kvrouter — the two set-up commands are `make demo` and `make test`.
# Both install what is missing (libzmq, Go modules) and build bin/caddy.

GO      ?= go
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export CGO_ENABLED := 1

.PHONY: all deps build test test-unit test-race bench bench-proxy bench-scale demo demo-replicas replay overload fuzz fuzz-ci clean hostile sim

# Fuzz targets, as package:Target.
FUZZ_TARGETS := selection:FuzzDecodeJSON indexer:FuzzDecode indexer:FuzzFrames indexer:FuzzDeliver \
	indexer:FuzzZMTPScan indexer:FuzzZMTPConn caddymodule:FuzzOpenAIBody caddymodule:FuzzCaddyfile
FUZZTIME ?= 60s

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

bin/kvmock: $(shell find cmd/kvmock indexer selection -name '*.go') go.mod
	$(GO) build -o bin/kvmock ./cmd/kvmock

bin/kvsim: $(shell find cmd/kvsim internal selection indexer -name '*.go') go.mod
	$(GO) build -o bin/kvsim ./cmd/kvsim

# staticcheck, pinned, fetched from the Go module proxy on first use.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

# test: gofmt, vet and staticcheck, every package's tests (the Caddy integration
# tests included), then the end-to-end packages one at a time (fidelity: the
# built gateway in front of a faithful kvmock; make hostile's attacks: they
# measure the gateway's RSS and flood it with events, and beside the other
# packages' tests on two cores they would starve them and their peaks would
# measure the neighbours), then the race detector over the concurrent
# packages.
test: deps build bin/kvmock
	@unformatted=$$(gofmt -l $$(find . -name '*.go' -not -path './bin/*')); \
	if [ -n "$$unformatted" ]; then echo "not gofmt-formatted: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	$(GO) test -count=1 $$($(GO) list ./... | grep -v '/hostile$$\|/fidelity$$')
	$(GO) test -count=1 -p 1 ./fidelity/ ./hostile/
	$(GO) test -race -count=1 ./selection/... ./indexer/ ./caddymodule/
	$(MAKE) fuzz-ci

# fuzz runs every fuzz target for FUZZTIME; fuzz-ci, every one briefly.
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$pkg $$name ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) ./$$pkg/ || exit 1; \
	done

# fuzz-ci counts executions rather than seconds: with a duration, Go 1.26's
# fuzz coordinator can report its own deadline as a failure
# ("context deadline exceeded", no failing input) when a worker is
# mid-call as the time runs out; a count has no deadline to race.
fuzz-ci:
	@$(MAKE) --no-print-directory fuzz FUZZTIME=2000x

bench: deps
	$(GO) test -run '^$$' -bench . -benchtime 2s ./selection/

# bench-proxy: the proxy path against a plain reverse_proxy (BENCHMARKS.md).
bench-proxy: build bin/kvbench
	./scripts/bench-proxy.sh

demo: deps build bin/kvbench bin/kvmock
	./scripts/demo.sh

# The official NATS server, built from its Go module (a test dependency, so
# go.mod pins it): no system package needed.
bin/nats-server: go.mod go.sum
	CGO_ENABLED=0 $(GO) build -o bin/nats-server github.com/nats-io/nats-server/v2

demo-replicas: deps build bin/kvbench bin/kvmock bin/nats-server
	./scripts/demo-replicas.sh

# bench-scale: 1,024 kvmock workers publishing real KV events and 8,192
# concurrent agentic sessions through one gateway (BENCHMARKS.md, "Scale
# run"); about three minutes, not part of CI.
bench-scale: deps build bin/kvbench bin/kvmock
	./scripts/bench-scale.sh

# replay: the first 1,600 requests of a Mooncake-format trace (the file
# TRACE names) at 4x speed through
# kv_router, round_robin and least_conn in front of 8 kvmock workers
# (BENCHMARKS.md, "Trace replay"); about seven minutes, not part of CI.
# Without the trace it says so and does nothing.
replay: deps build bin/kvbench bin/kvmock
	./scripts/replay.sh

# sim: the seed setup in virtual time (docs/kvsim.md): 1,024 simulated
# workers, 8,192 agentic sessions of ~99k-token context, through the real
# router and index and five baselines; a table, and JSON and SVG in
# SIM_OUT. Deterministic per seed; several minutes on 2 cores, not part
# of CI.
SIM_OUT ?= /tmp/kvrouter-sim
sim: deps bin/kvsim
	@mkdir -p $(SIM_OUT)
	./bin/kvsim --json $(SIM_OUT)/seed.json --svg $(SIM_OUT)/seed.svg $(SIM_ARGS)

# overload: the fleet's capacity, then 0.8x and 2x of it offered open loop
# with the overload queue, and 2x without (issue 12, item 5; BENCHMARKS.md).
overload: deps build bin/kvbench bin/kvmock
	./scripts/overload.sh

# hostile: the attacks of issue 10 against the built gateway as a separate
# process (hostile/); prints expected and observed answers, RSS and fds
# (RELIABILITY.md, "Hostile inputs"). About a minute on 2 cores.
hostile: build
	$(GO) test -count=1 -v -run Hostile ./hostile/

clean:
	rm -rf bin
