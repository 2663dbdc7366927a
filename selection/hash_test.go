package selection

import (
	"encoding/json"
	"os"
	"slices"
	"testing"

	"github.com/zeebo/xxh3"
)

func TestXXH3KnownAnswer(t *testing.T) {
	if got := xxh3.HashSeed([]byte("test data"), HashSeed); got != 13226331709069118873 {
		t.Fatalf("XXH3_64(test data, 1337) = %d", got)
	}
}

// TestHashVectors checks block and sequence hashes against the project's
// known answers (testdata/hash-vectors.json; docs/hashing.md).
func TestHashVectors(t *testing.T) {
	raw, err := os.ReadFile("testdata/hash-vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Cases []struct {
			Name           string   `json:"name"`
			BlockSize      int      `json:"block_size"`
			TokenIDs       []uint32 `json:"token_ids"`
			BlockHashes    []uint64 `json:"block_hashes"`
			SequenceHashes []uint64 `json:"sequence_hashes"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Cases) == 0 {
		t.Fatal("no cases")
	}
	for i, c := range doc.Cases {
		blocks := AppendBlockHashes(nil, c.TokenIDs, c.BlockSize, HashOptions{})
		if !slices.Equal(blocks, c.BlockHashes) {
			t.Errorf("Test %d (%s): block hashes %v, want %v", i, c.Name, blocks, c.BlockHashes)
		}
		seq := AppendSequenceHashes(nil, blocks)
		if !slices.Equal(seq, c.SequenceHashes) {
			t.Errorf("Test %d (%s): sequence hashes %v, want %v", i, c.Name, seq, c.SequenceHashes)
		}
	}
}

func TestSaltedSeed(t *testing.T) {
	if SaltedSeed("", "") != HashSeed {
		t.Fatal("empty lora and salt must keep the base seed")
	}
	lora := HashSeed + xxh3.HashStringSeed("adapter", 0)
	if SaltedSeed("adapter", "") != lora {
		t.Fatal("lora seed")
	}
	if SaltedSeed("adapter", "ns") != lora+xxh3.HashStringSeed("ns", 1) {
		t.Fatal("lora + salt seed")
	}
	tokens := []uint32{1, 2, 3, 4}
	plain := AppendBlockHashes(nil, tokens, 4, HashOptions{})
	salted := AppendBlockHashes(nil, tokens, 4, HashOptions{Seed: SaltedSeed("", "ns")})
	if plain[0] == salted[0] {
		t.Fatal("cache salt must change the block hash")
	}
}

func TestEagleAndMMHashing(t *testing.T) {
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	tests := []struct {
		n, bs int
		eagle bool
		want  int
	}{
		{9, 4, false, 2}, {9, 4, true, 2}, {8, 4, true, 1}, {4, 4, true, 0}, {0, 4, false, 0}, {3, 0, false, 0},
	}
	for i, tc := range tests {
		if got := BlockCount(tc.n, tc.bs, tc.eagle); got != tc.want {
			t.Errorf("Test %d: BlockCount(%d,%d,%v)=%d want %d", i, tc.n, tc.bs, tc.eagle, got, tc.want)
		}
	}
	eagle := AppendBlockHashes(nil, tokens, 4, HashOptions{Eagle: true})
	le := func(ts []uint32) []byte {
		var b []byte
		for _, t := range ts {
			b = append(b, byte(t), byte(t>>8), byte(t>>16), byte(t>>24))
		}
		return b
	}
	// An Eagle block hashes its block_size tokens plus the next one.
	if eagle[0] != xxh3.HashSeed(le(tokens[0:5]), HashSeed) || eagle[1] != xxh3.HashSeed(le(tokens[4:9]), HashSeed) {
		t.Fatal("eagle window hashing")
	}
	mm := []*BlockMMInfo{nil, {MMObjects: []MMObject{{MMHash: 9}, {MMHash: 3}}}}
	got := AppendBlockHashes(nil, tokens[:8], 4, HashOptions{MM: mm})
	in := le(tokens[4:8])
	for _, h := range []uint64{3, 9} { // sorted ascending, little-endian u64
		for k := 0; k < 8; k++ {
			in = append(in, byte(h>>(8*k)))
		}
	}
	if got[0] != xxh3.HashSeed(le(tokens[0:4]), HashSeed) || got[1] != xxh3.HashSeed(in, HashSeed) {
		t.Fatal("multimodal block hashing")
	}
}
