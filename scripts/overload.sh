#!/usr/bin/env bash
# make overload: overload control (issue 12, item 5) measured. A kvmock
# fleet registers with one gateway (scripts/overload.Caddyfile) that has
# two kv_router listeners on the same router: one with the overload queue,
# one without. Every request streams a completion of a fresh random
# prompt (nothing cached), so the fleet's capacity is a number of
# requests per second. The script
#   1. measures that capacity: a closed loop, never idle, through the
#      listener without the queue;
#   2. offers 0.8x of it, open loop (Poisson arrivals), with the queue;
#   3. offers 2x, with the queue;
#   4. offers 2x without the queue (the baseline);
# and prints the runs side by side: admitted requests' TTFT (p99 as a
# ratio of the 0.8x run's) and how fast the 429s came. The target: at 2x,
# admitted TTFT p99 <= 2x that at 0.8x, and the rest 429 within 100 ms.
# It stops everything it started. BENCHMARKS.md, "Overload control
# (issue 12, item 5)", has a run's figures.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

OUT=${OVERLOAD_OUT:-/tmp/kvrouter-overload}
WORKERS=${OVERLOAD_WORKERS:-4}
TOKENS=${OVERLOAD_TOKENS:-2000}       # prompt tokens per request
OUTPUT=${OVERLOAD_OUTPUT:-16}         # output tokens per request
DURATION=${OVERLOAD_DURATION:-30s}    # each open-loop run
CAPACITY_CLIENTS=${OVERLOAD_CAPACITY_CLIENTS:-$((WORKERS * 8))}
QUEUE=http://127.0.0.1:28080
NOQUEUE=http://127.0.0.1:28081
API=http://127.0.0.1:28092
export OVERLOAD_PREFILL_BUSY=${OVERLOAD_PREFILL_BUSY:-0.5}
export OVERLOAD_MAX_WAIT=${OVERLOAD_MAX_WAIT:-250ms}

mkdir -p "$OUT"
rm -f "$OUT"/*.json
ports_free "make overload" 28080 28081 28092 29019 28000 28101 28201 28301
stop_on_exit

./bin/caddy run --config scripts/overload.Caddyfile --adapter caddyfile >"$OUT/gateway.log" 2>&1 &
GW=$!
wait_healthy "$API" "$OUT/gateway.log" || exit 1

echo "== $WORKERS kvmock workers (20,000 uncached prompt tokens/s each, 5 ms decode steps, 8,192-token steps)"
./bin/kvmock --workers "$WORKERS" --http-base-port 28100 --zmq-base-port 28200 --replay-base-port 28300 \
	--admin 127.0.0.1:28000 --register "$API" >"$OUT/kvmock.log" 2>&1 &
MOCK=$!
wait_workers "$API" "$WORKERS" "$OUT/kvmock.log" || exit 1

LOAD=(--tokens "$TOKENS" --output-tokens "$OUTPUT")
echo "== capacity: closed loop, $CAPACITY_CLIENTS clients, ${DURATION}, no queue"
./bin/kvbench openloop --url "$NOQUEUE" "${LOAD[@]}" --concurrency "$CAPACITY_CLIENTS" --duration "$DURATION" \
	--label capacity --json "$OUT/0-capacity.json"
CAP=$(jq .goodput_rps "$OUT/0-capacity.json")
LOW=$(awk -v c="$CAP" 'BEGIN { printf "%.2f", 0.8 * c }')
HIGH=$(awk -v c="$CAP" 'BEGIN { printf "%.2f", 2 * c }')
echo "== capacity $CAP req/s: offering $LOW (0.8x) and $HIGH (2x) req/s"

run() { # label url rate file
	curl -fsS -X POST http://127.0.0.1:28000/reset >/dev/null
	./bin/kvbench openloop --url "$2" "${LOAD[@]}" --rate "$3" --duration "$DURATION" --seed 7 \
		--label "$1" --json "$OUT/$4.json"
}
run "0.8x, queue" "$QUEUE" "$LOW" 1-low-queue
run "2x, queue" "$QUEUE" "$HIGH" 2-high-queue
run "2x, no queue" "$NOQUEUE" "$HIGH" 3-high-noqueue

echo
echo "prefill_busy_threshold $OVERLOAD_PREFILL_BUSY, max_wait $OVERLOAD_MAX_WAIT, $TOKENS-token prompts, $OUTPUT output tokens"
./bin/kvbench openloop --table "$OUT/1-low-queue.json" "$OUT/2-high-queue.json" "$OUT/3-high-noqueue.json" "$OUT/0-capacity.json"
echo
echo "the gateway's overload metrics:"
curl -fsS http://127.0.0.1:29019/metrics | grep -E '^kvrouter_(overload_(admitted|shed)_total|worker_overloaded_total)' || true
echo "results: $OUT/*.json   logs: $OUT/gateway.log $OUT/kvmock.log"
