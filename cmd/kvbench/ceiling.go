package main

// The ceiling of a run's prefix hit ratio: what one worker with an
// unbounded cache would have had for the same completed requests. It tells
// a routing loss (the hit ratio below the ceiling) from what the trace
// itself cannot reuse (first turns, trimmed contexts, partial blocks).

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b []uint32) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// A chat session's turns count one token per word of their messages
// (workload.go): the chat template's own tokens (headers, the tools) are
// not in them, so for chat sessions the ceiling is a little low, and a
// run where most requests hit can show a hit ratio just above it.

// reusable is how many of prompt's tokens a prefix cache holding the
// earlier prompts could serve: whole blocks only, and never the last
// token, which a vLLM engine always computes to sample from.
func reusable(prompt []uint32, earlier [][]uint32, blockSize int) int {
	best := 0
	for _, e := range earlier {
		best = max(best, commonPrefix(prompt, e))
	}
	best = min(best, len(prompt)-1)
	return max(0, best/blockSize*blockSize)
}

// ceilingTokens sums, over the completed requests of rs, the tokens an
// unbounded single cache would have served: each turn can reuse its
// session's earlier turns and another session's first turn (which carries
// the shared system prompt of the agentic workload).
func ceilingTokens(trace []session, rs []result, blockSize int) int64 {
	if blockSize <= 0 || len(trace) == 0 {
		return 0
	}
	var total int64
	for _, r := range rs {
		if r.Err != nil || r.Session < 0 || r.Session >= len(trace) || r.Turn >= len(trace[r.Session].Turns) {
			continue
		}
		turns := trace[r.Session].Turns
		earlier := make([][]uint32, 0, r.Turn+1)
		for k := range r.Turn {
			earlier = append(earlier, turns[k].Prompt)
		}
		if other := (r.Session + 1) % len(trace); other != r.Session {
			earlier = append(earlier, trace[other].Turns[0].Prompt)
		}
		total += int64(reusable(turns[r.Turn].Prompt, earlier, blockSize))
	}
	return total
}
