# Shell functions shared by the scripts that start a gateway (sourced).

# wait_healthy API LOG waits up to 10 s for the selection API at API to
# answer /health; if it does not, it says where the gateway's log is and
# fails.
wait_healthy() {
	for _ in $(seq 1 100); do
		curl -fsS "$1/health" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "the gateway did not start; see $2"
	return 1
}
