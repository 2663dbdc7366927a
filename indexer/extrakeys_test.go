package indexer

import (
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// vStore is a vLLM BlockStored in its current map form, written with the
// independent msgpack library: one engine block per 4 tokens, hashes
// named from base, extra_keys as given (nil: the field left out).
func vStore(t *testing.T, base uint64, parent any, tokens []uint32, lora any, extraKeys []any) []byte {
	t.Helper()
	hashes, toks := []any{}, []any{}
	for i := range len(tokens) / 4 {
		hashes = append(hashes, base+uint64(i))
	}
	for _, tok := range tokens {
		toks = append(toks, tok)
	}
	ev := map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": toks,
		"block_size": 4, "lora_id": nil, "medium": "GPU", "lora_name": lora}
	if extraKeys != nil {
		ev["extra_keys"] = extraKeys
	}
	return ref(t, map[string]any{"ts": 1.0, "events": []any{ev}, "data_parallel_rank": 0})
}

// applyPayload decodes payload and applies its events for rank r.
func applyPayload(t *testing.T, x *Index, r selection.Rank, payload []byte) {
	t.Helper()
	var d Decoder
	b, err := d.Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b.Events {
		if err := x.Apply(part, r, &b.Events[i]); err != nil {
			t.Fatal(err)
		}
	}
}

// depthOf is how many of blocks worker w holds from the start.
func heldDepth(x *Index, blocks []uint64, w uint64) int {
	var m selection.Matches
	x.FindMatches(part, blocks, &m)
	for _, mt := range m.List {
		if mt.Rank.WorkerID == w {
			return int(mt.Tiers.Device)
		}
	}
	return 0
}

func seq(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

// TestVLLMSaltFromExtraKeys: vLLM names a request's cache_salt only in
// the first block's extra_keys of the store that starts the chain. The
// chain's blocks are then salted: a salted prompt finds them all, across
// a second store that continues the chain without the salt and a third
// that branches from its middle; an unsalted prompt of the same tokens
// finds none. Without the extra_keys reading the salted prompt found 0
// blocks and the unsalted one 3; without inheriting the salt, the
// continuations were lost.
func TestVLLMSaltFromExtraKeys(t *testing.T) {
	x := New()
	x.ConfigurePartition(part, 4, false)
	r := selectionRank(1)
	first, more, branch := seq(100, 12), seq(200, 8), seq(300, 4)
	applyPayload(t, x, r, vStore(t, 10, nil, first, nil, []any{[]any{"tenant-a"}, nil, nil}))
	applyPayload(t, x, r, vStore(t, 20, uint64(12), more, nil, []any{nil, nil}))
	applyPayload(t, x, r, vStore(t, 30, uint64(11), branch, nil, []any{nil}))

	salted := selection.HashOptions{Seed: selection.SaltedSeed("", "tenant-a")}
	chain := append(append([]uint32{}, first...), more...)
	if got := heldDepth(x, selection.AppendBlockHashes(nil, chain, 4, salted), 1); got != 5 {
		t.Errorf("salted prompt over the chain and its continuation: %d blocks, want 5", got)
	}
	branched := append(append([]uint32{}, first[:8]...), branch...)
	if got := heldDepth(x, selection.AppendBlockHashes(nil, branched, 4, salted), 1); got != 3 {
		t.Errorf("salted prompt over the branch: %d blocks, want 3", got)
	}
	if got := heldDepth(x, selection.AppendBlockHashes(nil, chain, 4, selection.HashOptions{}), 1); got != 0 {
		t.Errorf("unsalted prompt matched %d salted blocks", got)
	}
	other := selection.HashOptions{Seed: selection.SaltedSeed("", "tenant-b")}
	if got := heldDepth(x, selection.AppendBlockHashes(nil, chain, 4, other), 1); got != 0 {
		t.Errorf("another tenant's prompt matched %d blocks", got)
	}

	// The salts leave with their blocks.
	var hashes []any
	for _, b := range []uint64{10, 11, 12, 20, 21, 30} {
		hashes = append(hashes, b)
	}
	applyPayload(t, x, r, ref(t, []any{1.0, []any{[]any{"BlockRemoved", hashes, "GPU"}}, 0}))
	tr := x.tree(part)
	tr.mu.RLock()
	left := len(tr.salts)
	tr.mu.RUnlock()
	if left != 0 {
		t.Errorf("%d salts kept after every salted block was removed", left)
	}
}

// TestVLLMExtraKeysLoraIsNotASalt: an adapter's requests carry its name
// in every block's extra_keys; that is the LoRA seed, not a salt, and a
// salt after it is still read.
func TestVLLMExtraKeysLoraIsNotASalt(t *testing.T) {
	x := New()
	x.ConfigurePartition(part, 4, false)
	tokens := seq(1, 8)
	applyPayload(t, x, selectionRank(1), vStore(t, 10, nil, tokens, "ad", []any{[]any{"ad"}, []any{"ad"}}))
	applyPayload(t, x, selectionRank(2), vStore(t, 20, nil, tokens, "ad", []any{[]any{"ad", "s"}, []any{"ad"}}))
	if got := heldDepth(x, selection.AppendBlockHashes(nil, tokens, 4, selection.HashOptions{Seed: selection.SaltedSeed("ad", "")}), 1); got != 2 {
		t.Errorf("adapter prompt: %d blocks on the unsalted worker, want 2", got)
	}
	if got := heldDepth(x, selection.AppendBlockHashes(nil, tokens, 4, selection.HashOptions{Seed: selection.SaltedSeed("ad", "s")}), 2); got != 2 {
		t.Errorf("salted adapter prompt: %d blocks on the salted worker, want 2", got)
	}
}

// TestVLLMMultimodalBlocksAreMarked: two workers cache one text prefix
// followed by different images of one size, whose placeholder tokens are
// the same. A prompt hashed from those tokens alone must not be promised
// the image blocks (nor what follows them) on either worker, only the
// text before; two workers holding the same image share its blocks.
func TestVLLMMultimodalBlocksAreMarked(t *testing.T) {
	x := New()
	x.ConfigurePartition(part, 4, false)
	tokens := append(seq(1, 4), 9, 9, 9, 9, 9, 9, 9, 9, 50, 51, 52, 53)
	image := func(id string) []any { return []any{nil, []any{[]any{id, 0}}, []any{[]any{id, -4}}, nil} }
	applyPayload(t, x, selectionRank(1), vStore(t, 10, nil, tokens, nil, image("cat")))
	applyPayload(t, x, selectionRank(2), vStore(t, 20, nil, tokens, nil, image("dog")))
	applyPayload(t, x, selectionRank(3), vStore(t, 30, nil, tokens, nil, image("cat")))
	plain := selection.AppendBlockHashes(nil, tokens, 4, selection.HashOptions{})
	for w := uint64(1); w <= 3; w++ {
		if got := heldDepth(x, plain, w); got != 1 {
			t.Errorf("worker %d: a prompt of the tokens alone matched %d blocks, want the 1 before the image", w, got)
		}
	}
	tr := x.tree(part)
	tr.mu.RLock()
	nodes := tr.nodes.Len()
	tr.mu.RUnlock()
	if nodes != 1+3+3 {
		t.Errorf("%d blocks indexed, want 7: the text block, and the image chains of cat (shared) and dog", nodes)
	}
}

// TestEncoderWritesVLLMExtraKeys: what kvmock publishes is read back the
// way vLLM's own events are.
func TestEncoderWritesVLLMExtraKeys(t *testing.T) {
	parent := uint64(5)
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		b := decodeOne(t, AppendBatch(nil, enc, 1, 0,
			&StoredBlocks{BlockHashes: []uint64{1, 2}, TokenIDs: seq(0, 8), BlockSize: 4, LoraName: "ad", CacheSalt: "s", MM: []string{"", "img"}},
			&StoredBlocks{BlockHashes: []uint64{3}, Parent: &parent, TokenIDs: seq(0, 4), BlockSize: 4, CacheSalt: "s"}))
		root, next := b.Events[0], b.Events[1]
		if root.CacheSalt != "s" || root.LoraName != "ad" || len(root.Marks) != 2 || root.Marks[0] != 0 || root.Marks[1] == 0 {
			t.Errorf("enc %d root: salt %q lora %q marks %v", enc, root.CacheSalt, root.LoraName, root.Marks)
		}
		if next.CacheSalt != "" || next.Marks != nil {
			t.Errorf("enc %d continuation: salt %q marks %v, want none (vLLM salts the first block only)", enc, next.CacheSalt, next.Marks)
		}
	}
}

// TestDecodeBoundsAPayloadsWork: a payload of more events, or more block
// hashes, than an engine's step makes is malformed, and so is an
// extra_keys longer than its event's blocks; one at the bounds decodes.
func TestDecodeBoundsAPayloadsWork(t *testing.T) {
	clears := func(n int) []byte {
		evs := make([]any, n)
		for i := range evs {
			evs[i] = []any{"AllBlocksCleared"}
		}
		return ref(t, []any{1.0, evs})
	}
	removal := func(n int) []byte {
		hs := make([]any, n)
		for i := range hs {
			hs[i] = uint64(i)
		}
		return ref(t, []any{1.0, []any{[]any{"BlockRemoved", hs, "GPU"}, []any{"BlockRemoved", []any{1}, "GPU"}}})
	}
	var d Decoder
	for _, c := range []struct {
		name    string
		payload []byte
		ok      bool
	}{
		{"events at the bound", clears(maxEventsPerPayload), true},
		{"one event more", clears(maxEventsPerPayload + 1), false},
		{"hashes at the bound", removal(maxHashesPerPayload - 1), true},
		{"one hash more", removal(maxHashesPerPayload), false},
		{"extra_keys for its blocks", vStore(t, 1, nil, seq(0, 8), nil, []any{nil, []any{"s"}}), true},
		{"extra_keys past its blocks", vStore(t, 1, nil, seq(0, 8), nil, []any{nil, nil, nil}), false},
	} {
		_, err := d.Decode(c.payload)
		if (err == nil) != c.ok {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}
