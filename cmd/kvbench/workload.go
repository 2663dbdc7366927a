package main

import (
	"fmt"
	"math/rand/v2"
)

// A workload is a deterministic trace: sessions of turns, each turn a
// prompt (token ids) and an output length. The same seed gives the same
// trace, so several policies can be compared on identical requests.

// workloadConfig shapes a trace.
type workloadConfig struct {
	Kind         string // agentic, multiturn or random
	Sessions     int
	Turns        int
	SystemTokens int // agentic: the shared system prompt
	TaskTokens   int // agentic: each session's own starting context (task, documents)
	TurnTokens   int // mean new tokens per turn (user message, tool result)
	OutputTokens int // output tokens per turn
	MaxISL       int // a context longer is compacted to half of it (system prompt and latest turns)
	Seed         uint64
}

// turn is one request of a session.
type turn struct {
	Prompt []uint32
	Output int
}

// session is one conversation; its turns run one after the other.
type session struct {
	ID    int
	Turns []turn
}

const vocab = 150_000

func randTokens(rng *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(rng.IntN(vocab))
	}
	return out
}

// around draws a length around mean (±50 %), at least 1.
func around(rng *rand.Rand, mean int) int {
	if mean <= 1 {
		return 1
	}
	return max(1, mean/2+rng.IntN(mean+1))
}

// buildTrace generates the sessions of a workload.
func buildTrace(c workloadConfig) ([]session, error) {
	switch c.Kind {
	case "agentic", "multiturn", "random":
	default:
		return nil, fmt.Errorf("unknown workload %q (agentic, multiturn, random)", c.Kind)
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x6b76))
	system := randTokens(rng, c.SystemTokens)
	sessions := make([]session, c.Sessions)
	for s := range sessions {
		sessions[s].ID = s
		var ctx []uint32
		switch c.Kind {
		case "agentic":
			// AgentX-like: the shared system prompt, then a long context
			// that grows with every turn: a user message, the assistant's
			// previous answer, tool-call results.
			ctx = append(ctx, system...)
			ctx = append(ctx, randTokens(rng, around(rng, max(c.TaskTokens, 1)))...) // the task
		case "multiturn":
			ctx = append(ctx, randTokens(rng, around(rng, c.TurnTokens))...)
		}
		for t := 0; t < c.Turns; t++ {
			var prompt []uint32
			switch c.Kind {
			case "random":
				prompt = randTokens(rng, around(rng, c.TurnTokens*4))
			default:
				if t > 0 {
					ctx = append(ctx, randTokens(rng, c.OutputTokens)...) // the previous answer
					if c.Kind == "agentic" && rng.IntN(3) > 0 {
						ctx = append(ctx, randTokens(rng, around(rng, c.TurnTokens*2))...) // a tool result
					}
					ctx = append(ctx, randTokens(rng, around(rng, c.TurnTokens/2))...) // the next message
				}
				if c.MaxISL > 0 && len(ctx) > c.MaxISL {
					// An agent whose context outgrows the window compacts
					// it: the system prompt and the latest turns, to half
					// the window, which then grows again. Cutting only the
					// excess every turn instead would make every later
					// turn a new prefix, which agents avoid because it
					// throws their prefix cache away.
					keep := min(c.SystemTokens, c.MaxISL/4)
					ctx = append(ctx[:keep:keep], ctx[len(ctx)-(c.MaxISL/2-keep):]...)
				}
				prompt = append([]uint32(nil), ctx...)
			}
			sessions[s].Turns = append(sessions[s].Turns, turn{Prompt: prompt, Output: c.OutputTokens})
		}
	}
	return sessions, nil
}
