# The fault drills of make demo-replicas (sourced by demo-replicas.sh
# faults, which has started NATS and the fleet): two synced replicas under
# the agentic trace, then
#   1. kill -9 of replica B with bookings outstanding: how long until A
#      holds none of B's bookings (its loads are its own, the truth), and
#      whether any request through A failed;
#   2. NATS stopped for 30 s under traffic through both, then started:
#      requests failed, how long until both are connected and hear each
#      other again, and whether, once the traffic ends, both replicas'
#      loads are back to zero (no booking lost or left behind);
#   3. a worker registered through A's selection API: how long until B's
#      catalog has it, and, deleted on A, until B's has it no more.
LEASE=${DEMO_LEASE:-3s}

# until_within SECONDS CMD... runs CMD every 50 ms until it succeeds, for
# at most SECONDS; it fails if CMD never did.
until_within() {
	local end=$(($(date +%s) + $1))
	shift
	until "$@"; do
		[ "$(date +%s)" -ge "$end" ] && return 1
		sleep 0.05
	done
}
no_remote_on_a() { [ "$(metric $((2120 + PORT_OFFSET)) kvrouter_cluster_remote_bookings)" = 0 ]; }
both_peers() { [ "$(metric $((2120 + PORT_OFFSET)) kvrouter_cluster_peers)" = 1 ] && [ "$(metric $((2121 + PORT_OFFSET)) kvrouter_cluster_peers)" = 1 ]; }
both_hold() {
	both_peers && [ "$(metric $((2120 + PORT_OFFSET)) kvrouter_cluster_remote_bookings)" != 0 ] && [ "$(metric $((2121 + PORT_OFFSET)) kvrouter_cluster_remote_bookings)" != 0 ]
}

echo "== two replicas synced over NATS (lease $LEASE)"
start_gateway sync-a $((8181 + PORT_OFFSET)) $((2120 + PORT_OFFSET)) gw-a
A=$LAST
start_gateway sync-b $((8182 + PORT_OFFSET)) $((2121 + PORT_OFFSET)) gw-b
B=$LAST
wait_metrics $((2120 + PORT_OFFSET)) $((2121 + PORT_OFFSET))
sleep 1

echo "== drill 1: kill -9 of replica B under traffic"
./bin/kvbench run "${TRACE[@]}" --duration 20s --url http://127.0.0.1:$((8181 + PORT_OFFSET)) >"$OUT/drill1-a.txt" 2>&1 &
KA=$!
./bin/kvbench run "${TRACE[@]}" --duration 20s --url http://127.0.0.1:$((8182 + PORT_OFFSET)) >"$OUT/drill1-b.txt" 2>&1 &
KB=$!
sleep 8
held=$(metric $((2120 + PORT_OFFSET)) kvrouter_cluster_remote_bookings)
t0=$(now_ms)
kill -9 "$B"
until_within 20 no_remote_on_a || echo "   A still holds B's bookings 20 s after the kill"
t1=$(now_ms)
echo "   A held $held of B's bookings when B was killed; it held none $((t1 - t0)) ms later (lease $LEASE)"
rc=0
wait "$KA" || rc=$?
echo "   requests through A (the survivor): exit $rc; $(grep -E '^gateway' "$OUT/drill1-a.txt" | head -1)"
wait "$KB" 2>/dev/null || true # B's kvbench: its gateway is gone, its failures are expected

echo "== drill 2: NATS stopped for 30 s under traffic through both replicas, then started"
start_gateway sync-b $((8182 + PORT_OFFSET)) $((2121 + PORT_OFFSET)) gw-b
wait_metrics $((2121 + PORT_OFFSET))
until_within 20 both_peers || { echo "   the replicas do not hear each other"; exit 1; }
# 256 sessions: enough requests to keep both replicas busy for the 50 s.
./bin/kvbench run "${TRACE[@]}" --sessions 256 --duration 50s --compare "split=http://127.0.0.1:$((8181 + PORT_OFFSET))+http://127.0.0.1:$((8182 + PORT_OFFSET))" >"$OUT/drill2.txt" 2>&1 &
KV=$!
sleep 10 # the trace of 256 sessions takes a few seconds to build
echo "   before: A connected $(metric $((2120 + PORT_OFFSET)) kvrouter_cluster_connected), A holds $(metric $((2120 + PORT_OFFSET)) kvrouter_cluster_remote_bookings) of B's bookings"
kill "$NATS"
wait "$NATS" 2>/dev/null || true
sleep 2
echo "   NATS down: A connected $(metric $((2120 + PORT_OFFSET)) kvrouter_cluster_connected), B connected $(metric $((2121 + PORT_OFFSET)) kvrouter_cluster_connected), A holds $(metric $((2120 + PORT_OFFSET)) kvrouter_cluster_remote_bookings) of B's bookings"
sleep 28
start_nats
t0=$(now_ms)
until_within 20 both_hold || echo "   not converged 20 s after NATS started"
t1=$(now_ms)
echo "   NATS back: both connected and holding each other's bookings $((t1 - t0)) ms after it started"
rc=0
wait "$KV" || rc=$?
echo "   requests through both: exit $rc; $(grep -E '^split' "$OUT/drill2.txt" | head -1)"
sleep 1
echo "   after the traffic: active requests in A's loads $(active $((8191 + PORT_OFFSET))), in B's $(active $((8192 + PORT_OFFSET))); remote bookings A $(metric $((2120 + PORT_OFFSET)) kvrouter_cluster_remote_bookings), B $(metric $((2121 + PORT_OFFSET)) kvrouter_cluster_remote_bookings)"
echo "   outages counted: A $(metric $((2120 + PORT_OFFSET)) kvrouter_cluster_outages_total), B $(metric $((2121 + PORT_OFFSET)) kvrouter_cluster_outages_total)"

echo "== drill 3: a worker registered through A's API, then deleted there"
on_b() { curl -fsS "http://127.0.0.1:$((8192 + PORT_OFFSET))/workers" | grep -q '"worker_id":100,'; }
not_on_b() { ! on_b; }
auth=(-H "Authorization: Bearer $KVROUTER_WRITE_TOKEN" -H "Content-Type: application/json")
t0=$(now_ms)
curl -fsS "${auth[@]}" -X POST "http://127.0.0.1:$((8191 + PORT_OFFSET))/workers" \
	-d "{\"worker_id\":100,\"endpoint\":\"127.0.0.1:$((8001 + PORT_OFFSET))\",\"block_size\":16}" >/dev/null
until_within 10 on_b || echo "   B does not have the worker 10 s after it was registered on A"
t1=$(now_ms)
curl -fsS "${auth[@]}" -X DELETE "http://127.0.0.1:$((8191 + PORT_OFFSET))/workers/100" >/dev/null
until_within 10 not_on_b || echo "   B still has the worker 10 s after it was deleted on A"
t2=$(now_ms)
echo "   registered on A: on B $((t1 - t0)) ms later; deleted on A: gone from B $((t2 - t1)) ms later"
echo "   catalog bucket watched: A $(metric $((2120 + PORT_OFFSET)) kvrouter_cluster_catalog_synced), B $(metric $((2121 + PORT_OFFSET)) kvrouter_cluster_catalog_synced); writes published by A $(metric $((2120 + PORT_OFFSET)) kvrouter_cluster_catalog_writes_total), applied by B $(metric $((2121 + PORT_OFFSET)) kvrouter_cluster_catalog_writes_total)"
echo "logs: $OUT/"
