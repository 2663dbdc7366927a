#!/usr/bin/env bash
# make demo-replicas: the kvmock fleet (eight simulated vLLM workers
# publishing KV-cache events over ZMQ), a NATS server (the official one,
# built from its Go module into bin/nats-server) and five gateways: one
# alone, two replicas that share their bookings and session leases over
# NATS (sync on), and two that do not (sync off). Every gateway declares
# the same eight workers and follows their events itself. The agentic
# trace of make demo goes through the one gateway, then split request by
# request over each pair (as a load balancer without stickiness splits
# it), with the workers' caches emptied before each run; kvbench prints
# the hit ratio and TTFT of each. Then it reports the NATS traffic per
# proxied request of the synced pair, and stops everything it started.
#
# scripts/demo-replicas.sh faults runs the fault drills instead (the
# synced pair only, under the trace): kill -9 of one replica with bookings
# outstanding, then NATS stopped for 30 s and started again
# (RELIABILITY.md).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${DEMO_OUT:-/tmp/kvrouter-demo-replicas}
DURATION=${DEMO_DURATION:-15s} # per run; three runs
KV_BLOCKS=${DEMO_KV_BLOCKS:-4096}
CHAT_SHARE=${DEMO_CHAT_SHARE:-0}
# DEMO_PORT_OFFSET moves every port below (and NATS's) by that much, so
# the demo can run beside another one on the same machine.
PORT_OFFSET=${DEMO_PORT_OFFSET:-0}
NATS_PORT=${DEMO_NATS_PORT:-$((4222 + PORT_OFFSET))}
WORKERS=8
mkdir -p "$OUT"

PIDS=()
stop_all() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap stop_all EXIT

# caddyfile NAME PORT ADMIN [CLUSTER-NAME] writes a gateway's Caddyfile:
# the eight kvmock workers declared, its proxy on 127.0.0.1:PORT, its
# admin API (with /metrics) on ADMIN, and with CLUSTER-NAME a cluster block
# on the demo's NATS server.
caddyfile() {
	local f="$OUT/Caddyfile.$1"
	{
		echo "{"
		echo "	admin localhost:$3"
		echo "	kv_router {"
		echo "		block_size 16"
		echo "		prefill_load_scale 4"
		if [ -n "${4:-}" ]; then
			echo "		cluster nats://127.0.0.1:$NATS_PORT {"
			echo "			name $4"
			echo "		}"
		fi
		for w in $(seq 1 $WORKERS); do
			echo "		worker $w {"
			echo "			endpoint 127.0.0.1:$((8000 + PORT_OFFSET + w))"
			echo "			kv_events tcp://127.0.0.1:$((5556 + PORT_OFFSET + w))"
			echo "			replay tcp://127.0.0.1:$((5656 + PORT_OFFSET + w))"
			echo "			block_size 16"
			echo "			total_kv_blocks $KV_BLOCKS"
			echo "			max_num_batched_tokens 8192"
			echo "		}"
		done
		echo "	}"
		echo "}"
		echo ":$2 {"
		echo "	bind 127.0.0.1"
		echo "	kv_router"
		echo "	reverse_proxy {"
		echo "		dynamic kv_router"
		echo "		lb_policy kv_router"
		echo "		lb_retries 2"
		echo "	}"
		echo "}"
		if [ -n "${4:-}" ]; then
			# The selection API, for /loads (read-only: no write token is
			# needed to read) and, in the fault drills, a worker registered
			# on one replica and read on the other.
			echo ":$(($2 + 10)) {"
			echo "	bind 127.0.0.1"
			echo "	kv_selection {"
			echo "		write_token {env.KVROUTER_WRITE_TOKEN}"
			echo "	}"
			echo "}"
		fi
	} >"$f"
	echo "$f"
}
KVROUTER_WRITE_TOKEN=${KVROUTER_WRITE_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
export KVROUTER_WRITE_TOKEN

# start_gateway NAME PORT ADMIN [CLUSTER-NAME]
start_gateway() {
	local f
	f=$(caddyfile "$@")
	./bin/caddy run --adapter caddyfile --config "$f" >"$OUT/gateway-$1.log" 2>&1 &
	PIDS+=($!)
	LAST=$!
}

# wait_metrics ADMIN... waits up to 30 s for each gateway's admin API.
wait_metrics() {
	for admin in "$@"; do
		for _ in $(seq 1 300); do
			curl -fsS "http://localhost:$admin/metrics" >/dev/null 2>&1 && break
			sleep 0.1
		done
		curl -fsS "http://localhost:$admin/metrics" >/dev/null || { echo "a gateway did not start; see $OUT/gateway-*.log"; exit 1; }
	done
}

# active API prints the active requests of every rank summed, from /loads.
active() {
	curl -fsS "http://127.0.0.1:$1/loads" | grep -o '"active_requests":[0-9]*' | awk -F: '{ s += $2 } END { print s + 0 }'
}

now_ms() { date +%s%3N; }

# metric ADMIN NAME prints the sum of a metric's series on a gateway.
metric() {
	curl -fsS "http://localhost:$1/metrics" | awk -v n="$2" '$1 == n || index($1, n "{") == 1 { s += $2 } END { printf "%.0f\n", s }'
}

# JetStream (-js) holds the catalog bucket; its store (-sd) outlives a
# restart of the server, as a deployed one's does, and starts empty with
# each run of the demo.
rm -rf "$OUT/nats-store"
start_nats() {
	./bin/nats-server -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$OUT/nats-store" >>"$OUT/nats.log" 2>&1 &
	PIDS+=($!)
	NATS=$!
}
echo "== NATS server (bin/nats-server) on 127.0.0.1:$NATS_PORT"
start_nats

echo "== $WORKERS simulated workers (kvmock)"
./bin/kvmock --workers $WORKERS --kv-blocks "$KV_BLOCKS" --admin 127.0.0.1:$((8000 + PORT_OFFSET)) \
	--http-base-port $((8001 + PORT_OFFSET)) --zmq-base-port $((5557 + PORT_OFFSET)) --replay-base-port $((5657 + PORT_OFFSET)) \
	--enable-prompt-tokens-details >"$OUT/kvmock.log" 2>&1 &
PIDS+=($!)

TRACE=(--workload agentic --sessions 64 --turns 32 --concurrency 32
	--system-tokens 1024 --task-tokens 8000 --turn-tokens 128 --max-isl 32768 --chat-share "$CHAT_SHARE")

if [ "${1:-}" = faults ]; then
	. scripts/demo-replicas-faults.sh
	exit 0
fi

echo "== five gateways: one alone, two replicas synced over NATS, two not"
start_gateway one $((8180 + PORT_OFFSET)) $((2119 + PORT_OFFSET))
start_gateway sync-a $((8181 + PORT_OFFSET)) $((2120 + PORT_OFFSET)) gw-a
start_gateway sync-b $((8182 + PORT_OFFSET)) $((2121 + PORT_OFFSET)) gw-b
start_gateway nosync-a $((8183 + PORT_OFFSET)) $((2122 + PORT_OFFSET))
start_gateway nosync-b $((8184 + PORT_OFFSET)) $((2123 + PORT_OFFSET))
wait_metrics $((2119 + PORT_OFFSET)) $((2120 + PORT_OFFSET)) $((2121 + PORT_OFFSET)) $((2122 + PORT_OFFSET)) $((2123 + PORT_OFFSET))
for _ in $(seq 1 100); do
	[ "$(metric $((2120 + PORT_OFFSET)) kvrouter_cluster_peers)" = 1 ] && [ "$(metric $((2121 + PORT_OFFSET)) kvrouter_cluster_peers)" = 1 ] && break
	sleep 0.1
done
echo "   synced replicas see each other: gw-a peers $(metric $((2120 + PORT_OFFSET)) kvrouter_cluster_peers), gw-b peers $(metric $((2121 + PORT_OFFSET)) kvrouter_cluster_peers)"

echo "== the agentic trace: one gateway, two synced replicas, two unsynced ($DURATION each)"
./bin/kvbench run "${TRACE[@]}" --duration "$DURATION" \
	--compare "one=http://127.0.0.1:$((8180 + PORT_OFFSET)),sync_on=http://127.0.0.1:$((8181 + PORT_OFFSET))+http://127.0.0.1:$((8182 + PORT_OFFSET)),sync_off=http://127.0.0.1:$((8183 + PORT_OFFSET))+http://127.0.0.1:$((8184 + PORT_OFFSET))" \
	--reset http://127.0.0.1:$((8000 + PORT_OFFSET))/reset --json "$OUT/results.json" --plot "$OUT/ttft.svg"

# NATS traffic of the synced pair: what both replicas sent and received,
# per request they proxied.
routed=0 msgs=0 bytes=0
for admin in $((2120 + PORT_OFFSET)) $((2121 + PORT_OFFSET)); do
	routed=$((routed + $(metric "$admin" kvrouter_requests_total)))
	msgs=$((msgs + $(metric "$admin" kvrouter_cluster_messages_total)))
	bytes=$((bytes + $(metric "$admin" kvrouter_cluster_bytes_total)))
done
echo
echo "== NATS traffic of the synced pair (both replicas, sent + received)"
awk -v r="$routed" -v m="$msgs" -v b="$bytes" 'BEGIN {
	printf "   %d requests proxied, %d messages, %d bytes: %.2f messages and %.0f bytes per request\n", r, m, b, (r ? m / r : 0), (r ? b / r : 0) }'
echo "   dropped: gw-a $(metric $((2120 + PORT_OFFSET)) kvrouter_cluster_dropped_total), gw-b $(metric $((2121 + PORT_OFFSET)) kvrouter_cluster_dropped_total); refused: gw-a $(metric $((2120 + PORT_OFFSET)) kvrouter_cluster_refused_total), gw-b $(metric $((2121 + PORT_OFFSET)) kvrouter_cluster_refused_total)"
echo
echo "results: $OUT/results.json   logs: $OUT/"
