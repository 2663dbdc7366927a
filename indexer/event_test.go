package indexer

import (
	"errors"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// ref encodes v with an independent msgpack library, so the decoder is
// checked against payloads our own encoder did not write.
func ref(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func decodeOne(t *testing.T, payload []byte) *Batch {
	t.Helper()
	var d Decoder
	b, err := d.Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeEncodings(t *testing.T) {
	tokens := []any{1, 2, 3, 4}
	tests := []struct {
		name    string
		payload any
		want    Event
		dpRank  int64
	}{
		{"positional, legacy 2-element batch", []any{1.5, []any{
			[]any{"BlockStored", []any{uint64(1) << 63}, nil, tokens, 4, nil, "GPU"}}},
			Event{Kind: Stored, BlockHashes: []uint64{1 << 63}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4}, -1},
		{"positional with tail and dp rank", []any{1.5, []any{
			[]any{"BlockStored", []any{-5}, 7, tokens, 4, nil, "CPU", "lora-a", nil, 0, "full_attention", nil, "LOCAL", "extra"}}, 3},
			Event{Kind: Stored, BlockHashes: []uint64{^uint64(4)}, ParentHash: 7, HasParent: true, TokenIDs: []uint32{1, 2, 3, 4},
				BlockSize: 4, Tier: Host, LoraName: "lora-a"}, 3},
		{"map event, vLLM 0.26 capture shape", []any{1789095808.83, []any{map[string]any{
			"type": "BlockStored", "block_hashes": []any{uint64(1576)}, "parent_block_hash": nil, "token_ids": tokens,
			"block_size": 4, "lora_id": nil, "medium": "GPU", "lora_name": nil, "extra_keys": []any{nil}, "group_idx": 0,
			"kv_cache_spec_kind": "full_attention", "future_field": map[string]any{"x": 1}}}, 0},
			Event{Kind: Stored, BlockHashes: []uint64{1576}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4}, 0},
		{"outer map batch", map[string]any{"ts": 2.0, "events": []any{map[string]any{"type": "AllBlocksCleared"}}, "data_parallel_rank": 1},
			Event{Kind: Cleared}, 1},
		{"bin hash keeps the last 8 bytes", []any{1, []any{[]any{"BlockRemoved",
			[]any{[]byte{9, 9, 9, 9, 9, 9, 9, 9, 0, 0, 0, 0, 0, 0, 1, 2}}, "GPU"}}},
			Event{Kind: Removed, BlockHashes: []uint64{258}}, -1},
		{"SGLang salt map in lora_name", []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, tokens, 4, nil, "GPU",
			map[string]any{"cache_salt": "tenant"}}}, nil},
			Event{Kind: Stored, BlockHashes: []uint64{1}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4, CacheSalt: "tenant"}, -1},
		// SGLang's BlockStoredWithMetadata, positional, its metadata map
		// holding a session id beside the salt.
		{"SGLang metadata map with a session id", []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, tokens, 4, nil, "GPU",
			map[string]any{"cache_salt": "tenant", "session_id": "conv-9"}}}, 0},
			Event{Kind: Stored, BlockHashes: []uint64{1}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4, CacheSalt: "tenant"}, 0},
		{"Eagle bigram tokens", []any{1.0, []any{map[string]any{"type": "BlockStored", "block_hashes": []any{1},
			"token_ids": []any{[]any{1, 2}, []any{2, 3}, []any{3, 4}}, "block_size": 3}}},
			Event{Kind: Stored, BlockHashes: []uint64{1}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 3, Eagle: true}, -1},
		{"sliding-window group skipped", []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, tokens, 4, nil, nil, nil, nil, 1, "sliding_window"}}},
			Event{Kind: Stored, BlockHashes: []uint64{1}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4, Skip: true}, -1},
		{"unknown medium skipped", []any{1.0, []any{[]any{"BlockRemoved", []any{1}, "TAPE"}}},
			Event{Kind: Removed, BlockHashes: []uint64{1}, Skip: true}, -1},
		{"remote locality skipped", []any{1.0, []any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{1}, "locality": "REMOTE"}}},
			Event{Kind: Removed, BlockHashes: []uint64{1}, Skip: true}, -1},
	}
	for i, tc := range tests {
		b := decodeOne(t, ref(t, tc.payload))
		if len(b.Events) != 1 {
			t.Fatalf("Test %d (%s): %d events", i, tc.name, len(b.Events))
		}
		got := b.Events[0]
		w := tc.want
		if got.Kind != w.Kind || !slices.Equal(got.BlockHashes, w.BlockHashes) || got.ParentHash != w.ParentHash ||
			got.HasParent != w.HasParent || !slices.Equal(got.TokenIDs, w.TokenIDs) || got.BlockSize != w.BlockSize ||
			got.Tier != w.Tier || got.LoraName != w.LoraName || got.CacheSalt != w.CacheSalt || got.Eagle != w.Eagle || got.Skip != w.Skip {
			t.Errorf("Test %d (%s):\n got %+v\nwant %+v", i, tc.name, got, w)
		}
		if b.DPRank != tc.dpRank {
			t.Errorf("Test %d (%s): dp rank %d, want %d", i, tc.name, b.DPRank, tc.dpRank)
		}
	}
}

func TestEncoderRoundTrip(t *testing.T) {
	parent := uint64(77)
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		payload := AppendBatch(nil, enc, 12.5, 2,
			&StoredBlocks{BlockHashes: []uint64{1, 1 << 63}, Parent: &parent, TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4, LoraName: "l"},
			Removal{BlockHashes: []uint64{1}, Medium: "CPU"},
			Clear{})
		b := decodeOne(t, payload)
		if b.TS != 12.5 || b.DPRank != 2 || len(b.Events) != 3 {
			t.Fatalf("enc %d: %+v", enc, b)
		}
		s, r, c := b.Events[0], b.Events[1], b.Events[2]
		if s.Kind != Stored || !slices.Equal(s.BlockHashes, []uint64{1, 1 << 63}) || s.ParentHash != 77 || !s.HasParent ||
			len(s.TokenIDs) != 8 || s.BlockSize != 4 || s.LoraName != "l" || s.Skip {
			t.Fatalf("enc %d stored: %+v", enc, s)
		}
		if r.Kind != Removed || r.Tier != Host || c.Kind != Cleared {
			t.Fatalf("enc %d: %+v %+v", enc, r, c)
		}
		// The independent library reads what we wrote.
		var generic any
		if err := msgpack.Unmarshal(payload, &generic); err != nil {
			t.Fatalf("enc %d: reference decoder rejects our payload: %v", enc, err)
		}
	}
}

func TestDecodeRejectsMalformed(t *testing.T) {
	good := AppendBatch(nil, EncodingArray, 1, 0, &StoredBlocks{BlockHashes: []uint64{1}, TokenIDs: []uint32{1, 2}, BlockSize: 2})
	cases := map[string][]byte{
		"empty":               {},
		"not a batch":         ref(t, "hello"),
		"one-element batch":   ref(t, []any{1.0}),
		"unknown event":       ref(t, []any{1.0, []any{[]any{"BlockExploded"}}}),
		"map without type":    ref(t, []any{1.0, []any{map[string]any{"block_hashes": []any{1}}}}),
		"negative token":      ref(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{-1}, 1}}}),
		"string hash":         ref(t, []any{1.0, []any{[]any{"BlockStored", []any{"x"}, nil, []any{1}, 1}}}),
		"negative block_size": ref(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{1}, -1}}}),
		"block_size 2^63":     ref(t, []any{1.0, []any{map[string]any{"type": "BlockStored", "block_hashes": []any{1}, "token_ids": []any{1}, "block_size": uint64(1) << 63}}}),
		"trailing bytes":      append(append([]byte{}, good...), 0x01),
		"4 GiB array claim":   {0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff},
		"4 GiB string":        {0x92, 0x01, 0x91, 0x91, 0xdb, 0xff, 0xff, 0xff, 0xff},
		"deep nesting":        append(append([]byte{0x93, 0x01, 0x91, 0x9f}, make([]byte, 0)...), slices.Repeat([]byte{0x91}, 200)...),
	}
	for i := range len(good) {
		cases["truncated at "+string(rune('a'+i%26))+string(rune('0'+i/26))] = good[:i]
	}
	var d Decoder
	for name, p := range cases {
		if _, err := d.Decode(p); err == nil || !errors.Is(err, ErrPayload) {
			t.Errorf("%s: want ErrPayload, got %v", name, err)
		}
	}
	// The decoder still works after every failure.
	if _, err := d.Decode(good); err != nil {
		t.Fatal(err)
	}
}

// TestSGLangPageStream applies SGLang's shape: one BlockStored per page,
// signed int64 hashes chained by parent, the cache salt on every page,
// the batch always three elements (dp_rank nil).
func TestSGLangPageStream(t *testing.T) {
	// Both forms SGLang's stores take: positional, the salt in a map at
	// lora_name's place; and the tagged map of recent SGLang, the salt a
	// top-level member beside session_id.
	forms := map[string]func(h int64, parent any, pageTokens []any) any{
		"positional": func(h int64, parent any, pageTokens []any) any {
			return []any{"BlockStored", []any{h}, parent, pageTokens, page4, nil, "GPU", map[string]any{"cache_salt": "tenant-a"}}
		},
		"map": func(h int64, parent any, pageTokens []any) any {
			return map[string]any{"type": "BlockStored", "block_hashes": []any{h}, "parent_block_hash": parent,
				"token_ids": pageTokens, "block_size": page4, "lora_id": nil, "medium": "GPU",
				"cache_salt": "tenant-a", "session_id": "s-1"}
		},
	}
	for name, store := range forms {
		t.Run(name, func(t *testing.T) {
			x := New()
			x.ConfigurePartition(part, page4, false)
			r := selectionRank(3)
			tokens := []uint32{5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
			var d Decoder
			var parent any // nil for the first page
			for p := 0; p < len(tokens)/page4; p++ {
				h := -int64(1000 + p) // SGLang's first-8-bytes-as-int64 is often negative
				pageTokens := []any{}
				for _, tok := range tokens[p*page4 : (p+1)*page4] {
					pageTokens = append(pageTokens, tok)
				}
				b, err := d.Decode(ref(t, []any{1.0, []any{store(h, parent, pageTokens)}, nil}))
				if err != nil {
					t.Fatal(err)
				}
				if b.Events[0].CacheSalt != "tenant-a" {
					t.Fatalf("page %d: salt %q", p, b.Events[0].CacheSalt)
				}
				if err := x.Apply(part, r, &b.Events[0]); err != nil {
					t.Fatalf("page %d: %v", p, err)
				}
				parent = h
			}
			salted := selection.AppendBlockHashes(nil, tokens, page4, selection.HashOptions{Seed: selection.SaltedSeed("", "tenant-a")})
			plain := selection.AppendBlockHashes(nil, tokens, page4, selection.HashOptions{})
			var m selection.Matches
			x.FindMatches(part, salted, &m)
			if len(m.List) != 1 || m.List[0].Tiers.Device != 3 {
				t.Fatalf("salted prompt matched %+v, want 3 blocks", m.List)
			}
			m.Reset()
			x.FindMatches(part, plain, &m)
			if len(m.List) != 0 {
				t.Fatalf("an unsalted prompt matched a salted cache: %+v", m.List)
			}
		})
	}
}

// page4 is the page size of TestSGLangPageStream.
const page4 = 4

func selectionRank(w uint64) selection.Rank { return selection.Rank{WorkerID: w} }

// TestDecoderShedsLargeScratch: after a payload larger than an engine's
// step, Shed drops the scratch it grew (and the batch pointing into it);
// after an ordinary one it keeps the scratch for the next; decoding goes
// on either way.
func TestDecoderShedsLargeScratch(t *testing.T) {
	var d Decoder
	small := AppendBatch(nil, EncodingArray, 1, 0, &StoredBlocks{BlockHashes: []uint64{1, 2}, TokenIDs: make([]uint32, 32), BlockSize: 16})
	if _, err := d.Decode(small); err != nil {
		t.Fatal(err)
	}
	d.Shed()
	if d.tokens == nil || d.hashes == nil || d.events == nil {
		t.Fatal("an ordinary payload's scratch was dropped")
	}
	const blocks = 8192 // 131,072 tokens: past keepTokens
	hashes := make([]uint64, blocks)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	large := AppendBatch(nil, EncodingArray, 1, 0, &StoredBlocks{BlockHashes: hashes, TokenIDs: make([]uint32, 16*blocks), BlockSize: 16})
	b, err := d.Decode(large)
	if err != nil || len(b.Events) != 1 || len(b.Events[0].TokenIDs) != 16*blocks {
		t.Fatalf("the large payload: %v", err)
	}
	d.Shed()
	if cap(d.tokens) > keepTokens || d.batch.Events != nil {
		t.Fatalf("after the large payload, %d tokens of scratch and the batch kept", cap(d.tokens))
	}
	for _, e := range d.events[:cap(d.events)] {
		if e.TokenIDs != nil || e.BlockHashes != nil {
			t.Fatal("a kept event still points into the dropped scratch")
		}
	}
	if b, err := d.Decode(small); err != nil || len(b.Events) != 1 || len(b.Events[0].BlockHashes) != 2 {
		t.Fatalf("after shedding: %v", err)
	}
}
