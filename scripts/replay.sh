#!/usr/bin/env bash
# make replay: a Mooncake-format request trace (arrival times, lengths and
# 512-token block ids) replayed open loop through the gateway, started
# with Caddyfile.example, in front of eight simulated vLLM workers
# (kvmock) publishing real KV events, once per policy (kv_router, then the
# round_robin and least_conn baselines on the same workers), the workers'
# caches emptied before each. It prints each policy's TTFT, hit ratio and
# spread, and the hit ratio as a share of two ceilings computed from the
# trace (one unbounded cache; one LRU cache as large as the whole fleet's),
# then stops everything it started. BENCHMARKS.md, "Trace replay", has a
# run's figures.
#
# The trace is not part of the repository: TRACE names it. Without it, the
# script says so and exits 0.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TRACE=${TRACE:-}
case $TRACE in /*|'') ;; *) TRACE=$PWD/$TRACE ;; esac
cd "$ROOT"
if [ -z "$TRACE" ] || [ ! -r "$TRACE" ]; then
	echo "make replay: no trace${TRACE:+ at $TRACE}; nothing replayed."
	echo "Set TRACE to a Mooncake-format trace (JSON Lines, plain or gzipped; see BENCHMARKS.md, \"Trace replay\")."
	exit 0
fi
TRACE=$(cd "$(dirname "$TRACE")" && pwd)/$(basename "$TRACE")
. scripts/lib.sh

OUT=${REPLAY_OUT:-/tmp/kvrouter-replay}
REQUESTS=${REPLAY_REQUESTS:-1600}   # the first N requests of the trace
SPEED=${REPLAY_SPEED:-4}            # arrival times divided by this
KV_BLOCKS=${REPLAY_KV_BLOCKS:-32768} # per worker, in 16-token blocks (512k tokens)
MAX_MODEL_LEN=${REPLAY_MAX_MODEL_LEN:-131072}
WORKERS=8
GW_URL=http://127.0.0.1
POLICIES=${REPLAY_POLICIES:-kv_router=$GW_URL:8080,round_robin=$GW_URL:8081,least_conn=$GW_URL:8082}
API=http://127.0.0.1:8092
mkdir -p "$OUT"

# Caddyfile.example's listeners, kvmock's admin and its workers' HTTP
# ports: a gateway or fleet already on them would answer in our place.
ports_free "gateway or kvmock" 2019 8080 8081 8082 8083 8092 8000 $(seq 8001 $((8000 + WORKERS)))

start_example_gateway "$OUT"

wait_healthy "$API" "$OUT/gateway.log" || exit 1

echo "== starting $WORKERS simulated workers (kvmock): $KV_BLOCKS blocks of 16 tokens each, max model length $MAX_MODEL_LEN"
# kvmock's other settings are its defaults: 20,000 uncached prompt tokens
# per second per worker, 5 ms decode steps, 8,192 tokens per scheduler
# step. --enable-prompt-tokens-details: usage reports cached tokens, which
# is where kvbench reads the hit ratio.
./bin/kvmock --workers "$WORKERS" --kv-blocks "$KV_BLOCKS" --block-size 16 --max-model-len "$MAX_MODEL_LEN" \
	--register "$API" --admin 127.0.0.1:8000 --enable-prompt-tokens-details >"$OUT/kvmock.log" 2>&1 &
MOCK=$!
wait_workers "$API" "$WORKERS" "$OUT/kvmock.log" || exit 1

echo "== the first $REQUESTS requests of $TRACE at ${SPEED}x through each policy"
./bin/kvbench replay --trace "$TRACE" --requests "$REQUESTS" --speed "$SPEED" --max-model-len "$MAX_MODEL_LEN" \
	--block-size 16 --kv-blocks "$KV_BLOCKS" --workers "$WORKERS" \
	--predictions http://localhost:2019/kv_router/stats \
	--compare "$POLICIES" --reset http://127.0.0.1:8000/reset --json "$OUT/results.json" --plot "$OUT/ttft.svg"
echo
echo "results: $OUT/results.json   logs: $OUT/gateway.log $OUT/kvmock.log"
