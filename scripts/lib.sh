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

# start_example_gateway OUT starts bin/caddy with Caddyfile.example (its
# selection API's write token from KVROUTER_WRITE_TOKEN, made up when
# unset and exported for kvmock --register), logging to OUT/gateway.log.
# It sets GW to the gateway's pid and MOCK to empty (the caller sets it
# when it starts a fleet), and stops both when the script exits.
start_example_gateway() {
	KVROUTER_WRITE_TOKEN=${KVROUTER_WRITE_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
	export KVROUTER_WRITE_TOKEN
	./bin/caddy run --config Caddyfile.example >"$1/gateway.log" 2>&1 &
	GW=$!
	MOCK=
	trap stop_started EXIT
}

# stop_started stops the fleet (MOCK) and the gateway (GW) if they run.
stop_started() {
	[ -n "${MOCK:-}" ] && kill "$MOCK" 2>/dev/null
	[ -n "${GW:-}" ] && kill "$GW" 2>/dev/null
	wait 2>/dev/null || true
}

# ports_free WHAT PORT... exits the script when one of the ports already
# answers on loopback, naming WHAT (the run that may hold it).
ports_free() {
	what=$1
	shift
	for port in "$@"; do
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			echo "port $port is in use: is another $what (or something else) running?"
			exit 1
		fi
	done
}

# stop_on_exit makes the script stop what it starts (GW, MOCK; both empty
# now) when it exits, and exit on INT and TERM.
stop_on_exit() {
	GW=
	MOCK=
	trap stop_started EXIT
	trap 'exit 130' INT TERM
}

# wait_workers API N LOG waits up to 15 s for the selection API at API to
# count N schedulable workers; if it does not, it says where the fleet's
# log is and fails.
wait_workers() {
	for _ in $(seq 1 150); do
		curl -fsS "$1/ready" 2>/dev/null | grep -q "\"schedulable_workers\":$2" && return 0
		sleep 0.1
	done
	echo "workers did not register; see $3"
	return 1
}
