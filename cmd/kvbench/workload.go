package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
)

// A workload is a deterministic trace: sessions of turns, each turn a
// prompt (token ids) and an output length. The same seed gives the same
// trace, so several policies can be compared on identical requests. Each
// turn also keeps its prompt as the messages it is made of (system
// prompt, task, answers, tool results, user messages), which a chat
// session sends as text instead of the ids (chat.go).

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
	// ChatShare is the share of agentic sessions sent as chat (text
	// messages and tools) rather than as token ids.
	ChatShare float64
	Seed      uint64
}

// turn is one request of a session.
type turn struct {
	// Prompt is the turn's tokens; for a chat session it stands for the
	// text, one token per word (the template's tokens are not in it).
	Prompt []uint32
	// Messages are the parts Prompt is made of, in order.
	Messages []message
	Output   int
}

// message is one part of a conversation's context.
type message struct {
	Role string // system, user, assistant or tool
	IDs  []uint32
	// Answer is, for an assistant message, the turn whose output it is:
	// a chat session sends that turn's actual answer text.
	Answer int
	// ToolCall is set on an assistant message that called a tool, and on
	// the tool message that answers it.
	ToolCall bool
}

// session is one conversation; its turns run one after the other.
type session struct {
	ID    int
	Chat  bool // sent as chat messages, not token ids
	Turns []turn
}

// isChat spreads a share of n sessions evenly over their ids: session s
// is chat when the running count of chat sessions steps up at s.
func isChat(s int, share float64) bool {
	return int(float64(s+1)*share) > int(float64(s)*share)
}

// concat joins the messages' ids into one prompt.
func concat(msgs []message) []uint32 {
	n := 0
	for _, m := range msgs {
		n += len(m.IDs)
	}
	out := make([]uint32, 0, n)
	for _, m := range msgs {
		out = append(out, m.IDs...)
	}
	return out
}

// compact keeps the first keep tokens (of the system prompt) and the last
// tail tokens of a context, as messages: the messages cut keep the ids
// on their side of the cut.
func compact(msgs []message, keep, tail int) []message {
	var head []message
	for _, m := range msgs {
		if keep == 0 {
			break
		}
		n := min(keep, len(m.IDs))
		m.IDs = m.IDs[:n:n]
		head = append(head, m)
		keep -= n
	}
	var rest []message
	for i := len(msgs) - 1; i >= 0 && tail > 0; i-- {
		m := msgs[i]
		n := min(tail, len(m.IDs))
		m.IDs = m.IDs[len(m.IDs)-n:]
		rest = append(rest, m)
		tail -= n
	}
	for i := len(rest) - 1; i >= 0; i-- {
		head = append(head, rest[i])
	}
	return head
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
		sessions[s].Chat = c.Kind == "agentic" && isChat(s, c.ChatShare)
		var ctx []message
		switch c.Kind {
		case "agentic":
			// AgentX-like: the shared system prompt, then a long context
			// that grows with every turn: a user message, the assistant's
			// previous answer, tool-call results.
			ctx = append(ctx, message{Role: "system", IDs: system})
			ctx = append(ctx, message{Role: "user", IDs: randTokens(rng, around(rng, max(c.TaskTokens, 1)))}) // the task
		case "multiturn":
			ctx = append(ctx, message{Role: "user", IDs: randTokens(rng, around(rng, c.TurnTokens))})
		}
		for t := 0; t < c.Turns; t++ {
			var msgs []message
			switch c.Kind {
			case "random":
				msgs = []message{{Role: "user", IDs: randTokens(rng, around(rng, c.TurnTokens*4))}}
			default:
				if t > 0 {
					answer := message{Role: "assistant", IDs: randTokens(rng, c.OutputTokens), Answer: t - 1} // the previous answer
					if c.Kind == "agentic" && rng.IntN(3) > 0 {
						answer.ToolCall = true
						ctx = append(ctx, answer, message{Role: "tool", IDs: randTokens(rng, around(rng, c.TurnTokens*2)), ToolCall: true}) // a tool result
					} else {
						ctx = append(ctx, answer)
					}
					ctx = append(ctx, message{Role: "user", IDs: randTokens(rng, around(rng, c.TurnTokens/2))}) // the next message
				}
				if n := len(concat(ctx)); c.MaxISL > 0 && n > c.MaxISL {
					// An agent whose context outgrows the window compacts
					// it: the system prompt and the latest turns, to half
					// the window, which then grows again. Cutting only the
					// excess every turn instead would make every later
					// turn a new prefix, which agents avoid because it
					// throws their prefix cache away.
					keep := min(c.SystemTokens, c.MaxISL/4)
					ctx = compact(ctx, keep, c.MaxISL/2-keep)
				}
				msgs = slices.Clone(ctx)
			}
			sessions[s].Turns = append(sessions[s].Turns, turn{Prompt: concat(msgs), Messages: msgs, Output: c.OutputTokens})
		}
	}
	return sessions, nil
}
