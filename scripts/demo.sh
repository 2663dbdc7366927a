#!/usr/bin/env bash
# make demo: start the gateway with Caddyfile.example, register two workers
# through the Dynamo-compatible selection API, and show how a select follows
# a cached prefix. Everything started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

API=http://127.0.0.1:8092
ADMIN=http://localhost:2019
LOG=$(mktemp /tmp/kvrouter-demo.XXXXXX.log)

./bin/caddy run --config Caddyfile.example >"$LOG" 2>&1 &
CADDY=$!
trap 'kill $CADDY 2>/dev/null; wait $CADDY 2>/dev/null || true' EXIT

for _ in $(seq 1 100); do
	curl -fsS "$API/health" >/dev/null 2>&1 && break
	sleep 0.1
done
curl -fsS "$API/health" >/dev/null || { echo "gateway did not start; log:"; cat "$LOG"; exit 1; }

post() { curl -sS -X POST -H 'Content-Type: application/json' -d "$2" "$API$1"; echo; }
tokens() { seq -s, "$1" "$2"; }

echo "== register two workers (POST /workers)"
post /workers '{"worker_id":1,"endpoint":"127.0.0.1:8001","block_size":16}'
post /workers '{"worker_id":2,"endpoint":"127.0.0.1:8002","block_size":16}'

echo; echo "== readiness (GET /ready)"
curl -sS "$API/ready"; echo

PROMPT=$(tokens 1 512)
echo; echo "== first request: 512 tokens, nothing cached yet (POST /select_and_reserve)"
FIRST=$(post /select_and_reserve "{\"selection_id\":\"demo-1\",\"token_ids\":[$PROMPT]}")
echo "$FIRST" | sed -E 's/"sequence_hashes":\[[^]]*\]/"sequence_hashes":[…]/'
curl -sS -X DELETE "$API/reservations/demo-1" >/dev/null

echo; echo "== second request: the same 512 tokens plus 64 more (POST /select)"
echo "   it should go to the same worker, with overlap.gpu = 512 cached tokens"
post /select "{\"token_ids\":[$PROMPT,$(tokens 9000 9063)]}"

echo; echo "== loads (GET /loads)"
curl -sS "$API/loads"; echo
echo; echo "gateway log: $LOG"
