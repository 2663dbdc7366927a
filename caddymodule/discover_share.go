package caddymodule

import (
	"net/netip"
	"slices"
)

// shareOut divides total places among records that can each fill counts[i]
// of them: each gets an even share, and what a record cannot fill is
// divided again among those that can fill more (the leftover of an uneven
// division going to the first of them), so that no place is left unused
// while some record has an address for it. An SRV name of one single-pod
// target and one of 1,000 addresses, at max_workers 256, had the second
// cut to 128 with 127 places empty.
func shareOut(counts []int, total int) []int {
	shares := make([]int, len(counts))
	order := fewestFirst(len(counts), func(i int) int { return counts[i] })
	left := total
	for k, i := range order {
		rest := len(order) - k
		if even := left / rest; counts[i] > even {
			// This record and every later one (holding as many or more)
			// can fill more than the even share of what is left: they
			// split it, the first in record order taking the remainder.
			later := slices.Clone(order[k:])
			slices.Sort(later)
			for n, j := range later {
				shares[j] = even
				if n < left%rest {
					shares[j]++
				}
			}
			return shares
		}
		shares[i] = counts[i]
		left -= counts[i]
	}
	return shares
}

// fewestFirst is the indices 0..n-1 by count, fewest first, in index
// order among equals.
func fewestFirst(n int, count func(i int) int) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return count(a) - count(b) })
	return order
}

// knownFirst is n of ips on port: those whose endpoint the name holds
// first, then the others in answer order. The first n of the answer alone
// made a target answering more than its share in rotation trade workers
// at every answer.
func knownFirst(ips []netip.Addr, port uint16, n int, known map[netip.AddrPort]bool) []netip.Addr {
	if n >= len(ips) {
		return ips
	}
	out := slices.Clone(ips)
	slices.SortStableFunc(out, func(a, b netip.Addr) int {
		return keptFirst(known[netip.AddrPortFrom(a, port)], known[netip.AddrPortFrom(b, port)])
	})
	return out[:n]
}
