#!/usr/bin/env bash
# make bench-scale: the issue-5 scale run. 1,024 simulated vLLM workers
# (kvmock, one process) register with the gateway's selection API and
# publish real KV events over ZMQ; 8,192 agentic sessions run at once
# through one gateway (kv_router, scripts/bench-scale.Caddyfile). Prompts
# are scaled down so that the two shared cores of the reference machine
# carry the gateway, the fleet and the load generator together (the scale
# is printed). It reports requests, errors, req/s, TTFT, prefix hit
# ratio, the gateway's CPU per request, selection latency p50/p99 from the
# gateway's histogram, and the KV-event stream's health from the gateway's
# counters before and after (gaps, losses, and whether every batch the
# fleet published was received). It stops everything it started, and
# exits non-zero on a request error or an event stream that was not whole.
# Not part of CI: it takes about three minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

OUT=${SCALE_OUT:-/tmp/kvrouter-scale}
WORKERS=${SCALE_WORKERS:-1024}
SESSIONS=${SCALE_SESSIONS:-8192}
DURATION=${SCALE_DURATION:-90s}
# The scaled agentic workload: a 512-token shared system prompt, a
# ~1,024-token task per session, ~128 new tokens per turn (a tool result on
# two turns in three), 8 output tokens, 6 turns, a 4,096-token window.
# Prompts average about 2,000 tokens, against ~12,800 in make demo and tens
# of thousands in production agents: about 1/6 of the demo's.
WORKLOAD=(--workload agentic --turns 6 --system-tokens 512 --task-tokens 1024 --turn-tokens 128
	--output-tokens 8 --max-isl 4096)
# Ports, all on loopback, apart from the demo's (scripts/bench-scale.Caddyfile
# has the gateway's): the kvmock bases stay below 32768, where the kernel's
# ephemeral ports begin, and apart from each other.
GATEWAY=http://127.0.0.1:18080
API=http://127.0.0.1:18092
ADMIN=http://127.0.0.1:12019
FLEET=127.0.0.1:18000

mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/metrics-*.txt

# histogram_delta NAME BEFORE AFTER prints the count, mean, p50 and p99 (in
# ms) of the observations of an unlabelled Prometheus histogram made
# between two scrapes, each quantile interpolated within its bucket as
# Prometheus's histogram_quantile does.
histogram_delta() {
	awk -v name="$1" '
		function le(line) { sub(/.*le="/, "", line); sub(/".*/, "", line); return line }
		FNR == 1 { file++ }
		index($0, name "_bucket{") == 1 { b = le($1); if (file == 1) old[b] = $2; else { cur[b] = $2; if (!(b in seen)) { order[n++] = b; seen[b] = 1 } } }
		index($0, name "_sum ") == 1 { sum[file] = $2 }
		index($0, name "_count ") == 1 { cnt[file] = $2 }
		function quantile(q,   rank, i, prev, prevle, c, hi) {
			rank = q * total; prev = 0; prevle = 0
			for (i = 0; i < n; i++) {
				c = cur[order[i]] - old[order[i]]
				if (c >= rank) {
					if (order[i] == "+Inf") return "> " prevle * 1000
					hi = order[i] + 0
					return sprintf("%.3f", (prevle + (hi - prevle) * (c > prev ? (rank - prev) / (c - prev) : 0)) * 1000)
				}
				prev = c; prevle = order[i] + 0
			}
		}
		END {
			total = cnt[2] - cnt[1]
			if (total <= 0) { printf "%s: no observations\n", name; exit }
			printf "%s: %d selections, mean %.3f ms, p50 %s ms, p99 %s ms\n", name, total, (sum[2] - sum[1]) / total * 1000, quantile(0.5), quantile(0.99)
		}' "$2" "$3"
}

# counter_value NAME FILE prints an unlabelled counter's value (0 if absent).
counter_value() {
	awk -v name="$1" '$1 == name { v = $2 } END { printf "%d", v + 0 }' "$2"
}

ports_free "bench-scale" 18080 18092 12019 18000 20001 22001 24001
stop_on_exit

./bin/caddy run --config scripts/bench-scale.Caddyfile --adapter caddyfile >"$OUT/gateway.log" 2>&1 &
GW=$!
wait_healthy "$API" "$OUT/gateway.log" || exit 1

echo "== $WORKERS simulated workers (kvmock), registered through the selection API"
./bin/kvmock --workers "$WORKERS" --http-base-port 20001 --zmq-base-port 22001 --replay-base-port 24001 \
	--admin "$FLEET" --register "$API" >"$OUT/kvmock.log" 2>&1 &
MOCK=$!
# Schedulable, followed by a listener, and subscribed to: a batch published
# before the gateway's subscription reaches a worker would be a gap.
./bin/kvbench stats --admin "$ADMIN" --fleet "http://$FLEET" --ready "$WORKERS" --wait 120s
./bin/kvbench stats --admin "$ADMIN" --fleet "http://$FLEET" --save "$OUT/before.json"
curl -fsS "$ADMIN/metrics" >"$OUT/metrics-before.txt"

echo "== $SESSIONS concurrent agentic sessions through kv_router for $DURATION (prompts scaled to ~1/6 of make demo's)"
status=0
# Token-id prompts only (--chat-share 0): the scale run measures routing
# and the index, not the workers' /tokenize, and stays comparable with
# earlier runs.
./bin/kvbench run --url "$GATEWAY" "${WORKLOAD[@]}" --chat-share 0 --sessions "$SESSIONS" --concurrency "$SESSIONS" \
	--duration "$DURATION" --pid "$GW" --json "$OUT/run.json" >"$OUT/run.txt" 2>&1 || status=1
# The per-worker spread of 1,024 workers is one very long line: keep it in
# the file only.
grep -v '^gateway ' "$OUT/run.txt" | grep -v '^policy ' || true

echo
echo "== scale run: $WORKERS workers, $SESSIONS concurrent sessions, one gateway"
./bin/kvbench stats --admin "$ADMIN" --fleet "http://$FLEET" --since "$OUT/before.json" --run "$OUT/run.json" \
	--json "$OUT/report.json" --wait 30s --check || status=1
curl -fsS "$ADMIN/metrics" >"$OUT/metrics-after.txt"
echo
echo "== where the selections' time went (the router's split of each selection, over the run)"
for m in kvrouter_selection_lock_wait_seconds kvrouter_selection_lock_held_seconds kvrouter_selection_work_seconds; do
	histogram_delta "$m" "$OUT/metrics-before.txt" "$OUT/metrics-after.txt"
done
echo "picks made again under the lock: $(( $(counter_value kvrouter_selection_rechosen_total "$OUT/metrics-after.txt") - $(counter_value kvrouter_selection_rechosen_total "$OUT/metrics-before.txt") ))"
echo
echo "results: $OUT/report.json $OUT/run.json   logs: $OUT/gateway.log $OUT/kvmock.log"
if [ "$status" != 0 ]; then
	echo "FAILED: request errors, or the KV-event stream was not whole (see above)"
fi
exit "$status"
