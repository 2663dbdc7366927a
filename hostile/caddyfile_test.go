package hostile

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// The gateway's configuration for every attack: the bounds set low
// enough that each attack reaches its bound quickly on a 2-core machine.
const (
	model             = "m"
	blockSize         = 16
	workerDownAfter   = 2 * time.Second
	maxRanksPerWorker = 64
	// Each followed rank costs about five descriptors (its SUB socket, the
	// copy of its descriptor the listener parks on, and the socket monitor
	// that redials after an oversized message), so the catalog's rank
	// bound is what keeps them under fdLimit: 160 ranks allow two workers
	// of 64 (about 650 descriptors) and refuse the third.
	maxRanks                 = 160
	maxReservationsPerClient = 1024
	maxReservationBlocks     = 2_000_000 // max_reservation_blocks_per_client
	maxDumpEvents            = 100000
	indexBudget              = 64 << 20 // index_max_memory
	maxGap                   = 100000   // kv_events_max_gap
	responseHeaderTimeout    = 2 * time.Second
	rssLimit                 = 300 << 20
	fdLimit                  = 1024
)

// baseline, from KVROUTER_HOSTILE_BASELINE=1, leaves out the options issue
// 10 adds, so that a gateway built before them starts and the table records
// what it does with the same attacks (the "fails today" column).
var baseline = os.Getenv("KVROUTER_HOSTILE_BASELINE") == "1"

// ports are the gateway's three listeners, and the KV-event endpoint it
// binds when an attack needs bind mode.
type ports struct{ admin, proxy, api, events int }

// caddyfile is the gateway's config: Caddy's admin listener, the proxy
// site and the selection API site, all on 127.0.0.1, and with bind a
// KV-event endpoint that publishers dial (kv_events_bind). The catalog's
// write token comes from the environment, as Caddyfile.example shows it.
func caddyfile(p ports, bind bool) string {
	var limits, token, policy string
	if bind {
		limits = fmt.Sprintf(`
		kv_events_bind tcp://127.0.0.1:%d`, p.events)
	}
	if !baseline {
		limits += fmt.Sprintf(`
		max_ranks_per_worker %d
		max_ranks %d
		max_reservations_per_worker 4096
		max_reservations_per_client %d
		max_reservation_blocks_per_client %d
		max_dump_events %d
		index_max_memory %dMiB
		kv_events_max_message 4MiB
		kv_events_max_gap %d`, maxRanksPerWorker, maxRanks, maxReservationsPerClient, maxReservationBlocks, maxDumpEvents, indexBudget>>20, maxGap)
		token = `
		write_token {env.KVROUTER_WRITE_TOKEN}
	`
		policy = fmt.Sprintf(` {
			response_header_timeout %s
		}`, responseHeaderTimeout)
	}
	cfg := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	persist_config off
	auto_https off
	grace_period 1s
	kv_router {
		block_size %d
		worker_down_after %s%s
	}
}

:%d {
	bind 127.0.0.1
	kv_router
	reverse_proxy {
		dynamic kv_router
		lb_policy kv_router%s
		lb_retries 2
	}
}

:%d {
	bind 127.0.0.1
	kv_selection {%s}
}
`, p.admin, blockSize, workerDownAfter, limits, p.proxy, policy, p.api, token)
	return strings.ReplaceAll(cfg, "{}", "")
}
