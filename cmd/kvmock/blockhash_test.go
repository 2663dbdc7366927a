package main

import "testing"

func TestBlockHashesChain(t *testing.T) {
	toks := tokenRange(1, 40)
	h := blockHashes(toks, 16, "", "")
	if len(h) != 2 || h[0] != blockHash(noneHash, toks[:16]) || h[1] != blockHash(h[0], toks[16:32]) {
		t.Fatalf("hashes %x", h)
	}
	// The same block after a different prefix hashes differently.
	other := append(tokenRange(100, 16), toks[16:32]...)
	if blockHashes(other, 16, "", "")[1] == h[1] {
		t.Fatal("hash ignores the parent")
	}
}
