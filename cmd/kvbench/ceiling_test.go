package main

import (
	"errors"
	"testing"
)

// TestCeiling checks the unbounded-cache bound on hand-made prompts: whole
// blocks only, never the last token, the session's earlier turns and
// another session's first turn as sources, failed requests left out.
func TestCeiling(t *testing.T) {
	seq := func(from, n uint32) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = from + uint32(i)
		}
		return out
	}
	system := seq(1000, 8)
	cat := func(parts ...[]uint32) []uint32 {
		var out []uint32
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	trace := []session{
		{ID: 0, Turns: []turn{{Prompt: cat(system, seq(1, 5))}, {Prompt: cat(system, seq(1, 12))}, {Prompt: cat(system, seq(1, 12))}}},
		{ID: 1, Turns: []turn{{Prompt: cat(system, seq(500, 3))}}},
	}
	cases := []struct {
		name string
		rs   []result
		want int64
	}{
		// Session 1's first turn shares the 8-token system prompt with
		// session 0's first turn: two 4-token blocks.
		{"first turn: the shared system prompt", []result{{Session: 1, Turn: 0}}, 8},
		// Turn 1 (20 tokens) shares 13 tokens with turn 0: 3 whole blocks.
		{"a later turn: its session's earlier prompt", []result{{Session: 0, Turn: 1}}, 12},
		// Turn 2 repeats turn 1 (20 tokens, 5 whole blocks): all but the
		// last token may be reused, so 4 blocks.
		{"a repeated prompt: never the last token", []result{{Session: 0, Turn: 2}}, 16},
		{"failed requests do not count", []result{{Session: 0, Turn: 1, Err: errors.New("x")}, {Session: 9}}, 0},
	}
	for _, c := range cases {
		if got := ceilingTokens(trace, c.rs, 4); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
	if got := ceilingTokens(trace, []result{{Session: 0, Turn: 1}}, 0); got != 0 {
		t.Errorf("block size 0: %d", got)
	}
}

// TestSessionMoves counts a turn as a move only when its worker differs
// from the one of the session's latest earlier successful turn.
func TestSessionMoves(t *testing.T) {
	rs := []result{
		{Session: 0, Turn: 0, Worker: "1"},
		{Session: 0, Turn: 1, Worker: "1"},
		{Session: 0, Turn: 2, Worker: "2"}, // a move
		{Session: 0, Turn: 3, Worker: "1", Err: errors.New("x")},
		{Session: 0, Turn: 4, Worker: "2"}, // compared with turn 2: stays
		{Session: 1, Turn: 0, Worker: "2"}, // a first turn is never a move
		{Session: 1, Turn: 1, Worker: "3"}, // a move
	}
	if got := sessionMoves(rs); got != 2 {
		t.Fatalf("%d moves, want 2", got)
	}
}
