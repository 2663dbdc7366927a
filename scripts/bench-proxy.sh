#!/usr/bin/env bash
# Benchmarks of the proxy path (BENCHMARKS.md): the same small requests
# through kv_router + lb_policy kv_router and through a plain reverse_proxy
# with round_robin, in one run, and the gateway CPU per request of
# 100k-token completions. The upstreams are two kvbench sinks (read the
# request, answer a tiny completion) in their own processes, so the
# gateway's CPU is its own. Everything listens on 127.0.0.1 and is stopped
# on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
SMALL=${SMALL:-20000}   # small requests per round
ROUNDS=${ROUNDS:-3}
LARGE=${LARGE:-300}     # 100k-token requests
# The gateway binary, and the ports, so that two binaries can be compared
# (before and after a change) and two runs can share the machine.
CADDY=${CADDY:-./bin/caddy}
ADMIN_PORT=${ADMIN_PORT:-2999} # Caddy's admin, with /debug/pprof/
KV_PORT=${KV_PORT:-8081}       # kv_router + lb_policy kv_router
RR_PORT=${RR_PORT:-8082}       # plain reverse_proxy, round_robin
SINK1_PORT=${SINK1_PORT:-9101}
SINK2_PORT=${SINK2_PORT:-9102}
DIR=$(mktemp -d /tmp/kvrouter-bench.XXXXXX)

cat >"$DIR/gateway.caddyfile" <<CF
{
	admin localhost:$ADMIN_PORT
	auto_https off
	kv_router {
		block_size 16
		use_kv_events off
		worker 1 {
			endpoint 127.0.0.1:$SINK1_PORT
		}
		worker 2 {
			endpoint 127.0.0.1:$SINK2_PORT
		}
	}
}
:$KV_PORT {
	bind 127.0.0.1
	kv_router {
		tokenize off
	}
	reverse_proxy 127.0.0.1:$SINK1_PORT 127.0.0.1:$SINK2_PORT {
		lb_policy kv_router
	}
}
:$RR_PORT {
	bind 127.0.0.1
	reverse_proxy 127.0.0.1:$SINK1_PORT 127.0.0.1:$SINK2_PORT {
		lb_policy round_robin
	}
}
CF
./bin/kvbench sink --listen 127.0.0.1:$SINK1_PORT >"$DIR/sink1.log" 2>&1 &
UP=$!
./bin/kvbench sink --listen 127.0.0.1:$SINK2_PORT >"$DIR/sink2.log" 2>&1 &
UP="$UP $!"
"$CADDY" run --config "$DIR/gateway.caddyfile" >"$DIR/gateway.log" 2>&1 &
GW=$!
trap 'kill $UP $GW 2>/dev/null; wait $UP $GW 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
	curl -fsS -o /dev/null -X POST -d '{}' http://127.0.0.1:$RR_PORT/ 2>/dev/null && break
	sleep 0.1
done

rate() { sed -n 's/^throughput \([0-9.]*\) req\/s.*/\1/p'; }
# Warm both paths up first (connections, pools, the index), unmeasured.
./bin/kvbench completions --url http://127.0.0.1:$KV_PORT --tokens 64 --requests 3000 --concurrency 8 >/dev/null
./bin/kvbench completions --url http://127.0.0.1:$RR_PORT --tokens 64 --requests 3000 --concurrency 8 >/dev/null
echo "== small requests (64-token prompt, tiny reply), $ROUNDS rounds of $SMALL, concurrency 8"
kv=0; rr=0
for i in $(seq 1 "$ROUNDS"); do
	a=$(./bin/kvbench completions --url http://127.0.0.1:$KV_PORT --tokens 64 --requests "$SMALL" --concurrency 8 | rate)
	b=$(./bin/kvbench completions --url http://127.0.0.1:$RR_PORT --tokens 64 --requests "$SMALL" --concurrency 8 | rate)
	echo "round $i: kv_router $a req/s, round_robin $b req/s"
	kv=$(awk -v x="$kv" -v y="$a" 'BEGIN{print x+y}'); rr=$(awk -v x="$rr" -v y="$b" 'BEGIN{print x+y}')
done
awk -v x="$kv" -v y="$rr" 'BEGIN{printf "throughput ratio kv_router / round_robin: %.3f\n", x/y}'

echo "== 100k-token completions through kv_router, concurrency 2"
./bin/kvbench completions --url http://127.0.0.1:$KV_PORT --tokens 100000 --requests "$LARGE" --concurrency 2 --pid "$GW"
echo "== the same through plain reverse_proxy (round_robin), for reference"
./bin/kvbench completions --url http://127.0.0.1:$RR_PORT --tokens 100000 --requests "$LARGE" --concurrency 2 --pid "$GW"
