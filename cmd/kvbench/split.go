package main

import "strings"

// A target may name several gateways joined by "+" (for example
// sync_on=http://127.0.0.1:8080+http://127.0.0.1:9080): the requests are
// split over them as a load balancer without stickiness would, request
// by request, so session s's turn t goes to gateway (s+t) mod n. Half the
// sessions start on each of two replicas and every session's turns
// alternate between them: the case where replicas that do not share
// their bookings and leases lose the most.

// targetFor returns the gateway of a split target that session s's turn
// t goes to; a target of one gateway is returned as it is.
func targetFor(target string, s, t int) string {
	if !strings.Contains(target, "+") {
		return target
	}
	urls := strings.Split(target, "+")
	return urls[(s+t)%len(urls)]
}
