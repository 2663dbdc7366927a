#!/usr/bin/env bash
# make demo: eight simulated vLLM workers (kvmock) publishing real KV-cache
# events over ZMQ, the gateway run with Caddyfile.example, and the same
# agentic trace (shared system prompt, long growing contexts, tool-call
# turns) played through kv_router and through ordinary load balancing
# (round_robin, least_conn, random), with the workers' caches emptied
# before each run. Half the sessions send token ids; the other half talk
# chat with a tools array, as a coding agent does, which the gateway must
# tokenize through a worker's /tokenize (chat template, tools and all)
# before it can route them by prefix. It prints what KV-aware routing
# gained, how often the gateway predicted exactly the cached tokens the
# workers reported, and where the TTFT plot is, and stops everything it
# started.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

OUT=${DEMO_OUT:-/tmp/kvrouter-demo}
DURATION=${DEMO_DURATION:-15s}   # per policy; four policies: about a minute
# The trace: 64 agentic sessions of 32 turns, 32 in flight; each starts
# with a 1,024-token system prompt shared by all and an 8,000-token task
# context of its own (files read, the issue) and grows by about 250
# tokens a turn (tool results, messages, answers), to about 17k tokens.
# Each worker caches 4,096 blocks (64k tokens): about what its share of
# the sessions in flight needs when each session stays on one worker,
# and a small part of what it is asked for when every worker sees every
# session.
KV_BLOCKS=${DEMO_KV_BLOCKS:-4096}
# The share of the sessions sent as chat with tools instead of token ids.
CHAT_SHARE=${DEMO_CHAT_SHARE:-0.5}
# Caddy's admin API (Caddyfile.example's admin address), where
# /kv_router/stats has the gateway's predictions.
CADDY_ADMIN=http://localhost:2019
mkdir -p "$OUT"
API=http://127.0.0.1:8092
# Caddyfile.example reads the selection API's write token from the
# environment; kvmock --register sends it.
start_example_gateway "$OUT"

wait_healthy "$API" "$OUT/gateway.log" || exit 1

echo "== starting 8 simulated workers (kvmock), registered through the selection API"
# --enable-prompt-tokens-details: as with vLLM, usage reports cached
# tokens only when asked to, and both kvbench's hit ratio and the
# gateway's prediction accuracy read them there.
./bin/kvmock --workers 8 --kv-blocks "$KV_BLOCKS" --register "$API" --admin 127.0.0.1:8000 \
	--enable-prompt-tokens-details >"$OUT/kvmock.log" 2>&1 &
MOCK=$!
wait_workers "$API" 8 "$OUT/kvmock.log" || exit 1

echo "== the agentic trace through each policy ($DURATION each)"
./bin/kvbench run --workload agentic --sessions 64 --turns 32 --concurrency 32 --duration "$DURATION" \
	--system-tokens 1024 --task-tokens 8000 --turn-tokens 128 --max-isl 32768 --chat-share "$CHAT_SHARE" \
	--predictions "$CADDY_ADMIN/kv_router/stats" \
	--compare kv_router=http://127.0.0.1:8080,round_robin=http://127.0.0.1:8081,least_conn=http://127.0.0.1:8082,random=http://127.0.0.1:8083 \
	--reset http://127.0.0.1:8000/reset --pid "$GW" --json "$OUT/results.json" --plot "$OUT/ttft.svg"
echo
echo "results: $OUT/results.json   logs: $OUT/gateway.log $OUT/kvmock.log"
