package main

import "testing"

func TestTargetForSplitsRequestsEvenly(t *testing.T) {
	if got := targetFor("http://a", 3, 5); got != "http://a" {
		t.Fatalf("one gateway: %s", got)
	}
	counts := map[string]int{}
	for s := range 10 {
		first := targetFor("http://a+http://b", s, 0)
		for turn := range 4 {
			counts[targetFor("http://a+http://b", s, turn)]++
			if turn == 1 && targetFor("http://a+http://b", s, turn) == first {
				t.Fatalf("session %d's second turn went to the gateway of its first", s)
			}
		}
	}
	if counts["http://a"] != 20 || counts["http://b"] != 20 {
		t.Fatalf("split %v, want 20 and 20", counts)
	}
}
