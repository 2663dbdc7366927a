package indexer

import (
	"testing"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// groupEvent is a vLLM event of one KV-cache group, in the map form its
// hybrid cache manager publishes: a store of tokens (block size 4) under
// hashes base+1, base+2, ..., or a removal of those hashes. kind "" leaves
// kv_cache_spec_kind out, group < 0 leaves group_idx out.
func groupEvent(t *testing.T, store bool, group int, kind string, base uint64, tokens []uint32) []byte {
	t.Helper()
	var hashes []any
	for i := range len(tokens) / 4 {
		hashes = append(hashes, base+uint64(i)+1)
	}
	ev := map[string]any{"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}
	if store {
		toks := make([]any, len(tokens))
		for i, tok := range tokens {
			toks[i] = tok
		}
		ev = map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": nil, "token_ids": toks,
			"block_size": 4, "lora_id": nil, "medium": "GPU", "lora_name": nil, "extra_keys": nil}
		if kind != "" {
			ev["kv_cache_spec_kind"] = kind
		}
	}
	if group >= 0 {
		ev["group_idx"] = group
	}
	return ref(t, map[string]any{"ts": 1.0, "events": []any{ev}, "data_parallel_rank": 0})
}

// TestHybridModelsFollowTheFullAttentionGroup: vLLM numbers a hybrid
// model's KV-cache groups by their first layer, so its full-attention
// group is group 1 for gpt-oss and Gemma 3 (group 0: sliding window) and
// for Qwen3-Next (group 0: Mamba). The index used to keep group 0 alone,
// and then skip it for its kind: such a worker looked empty. It now
// follows the group a store names as full attention, whatever its number,
// and applies that group's removals only.
func TestHybridModelsFollowTheFullAttentionGroup(t *testing.T) {
	tokens := seq(100, 12)
	blocks := selection.AppendBlockHashes(nil, tokens, 4, selection.HashOptions{})
	for _, first := range []string{"sliding_window", "mamba"} {
		t.Run(first, func(t *testing.T) {
			x := New()
			x.ConfigurePartition(part, 4, false)
			r := selectionRank(1)
			applyPayload(t, x, r, groupEvent(t, true, 0, first, 0, tokens))
			applyPayload(t, x, r, groupEvent(t, true, 1, "full_attention", 100, tokens))
			if got := heldDepth(x, blocks, 1); got != 3 {
				t.Fatalf("%d blocks indexed, want the full-attention group's 3", got)
			}
			// The other group's removals (they name no kind) leave it be.
			applyPayload(t, x, r, groupEvent(t, false, 0, "", 0, tokens))
			if got := heldDepth(x, blocks, 1); got != 3 {
				t.Fatalf("group 0's removal took the index to %d blocks", got)
			}
			// The followed group's removal of the last block applies.
			applyPayload(t, x, r, groupEvent(t, false, 1, "", 102, tokens[:4]))
			if got := heldDepth(x, blocks, 1); got != 2 {
				t.Fatalf("after the full-attention group removed its last block: %d, want 2", got)
			}
		})
	}
}

// TestSecondFullAttentionGroupIsNotCountedTwice: a model whose
// full-attention layers make two groups stores the same blocks in each;
// the index follows the first named, so the other's removals do not take
// blocks the followed group still holds.
func TestSecondFullAttentionGroupIsNotCountedTwice(t *testing.T) {
	tokens := seq(300, 8)
	blocks := selection.AppendBlockHashes(nil, tokens, 4, selection.HashOptions{})
	x := New()
	x.ConfigurePartition(part, 4, false)
	r := selectionRank(1)
	applyPayload(t, x, r, groupEvent(t, true, 0, "full_attention", 0, tokens))
	applyPayload(t, x, r, groupEvent(t, true, 1, "full_attention", 0, tokens))
	if got := x.Blocks(part, r); got != 2 {
		t.Fatalf("%d entries, want 2", got)
	}
	applyPayload(t, x, r, groupEvent(t, false, 1, "", 0, tokens))
	if got := heldDepth(x, blocks, 1); got != 2 {
		t.Fatalf("the second group's removal took the index to %d blocks", got)
	}
	applyPayload(t, x, r, groupEvent(t, false, 0, "", 0, tokens))
	if got := x.Blocks(part, r); got != 0 {
		t.Fatalf("the followed group's removal left %d entries", got)
	}
}

// TestGroupsWithoutKinds: events that name no kind (releases before the
// hybrid manager published them) are group 0's; another group's are
// skipped, as they always were. A rank's choice lasts until its blocks
// are cleared: a restarted engine names its groups again.
func TestGroupsWithoutKinds(t *testing.T) {
	tokens := seq(500, 8)
	blocks := selection.AppendBlockHashes(nil, tokens, 4, selection.HashOptions{})
	x := New()
	x.ConfigurePartition(part, 4, false)
	r := selectionRank(1)
	applyPayload(t, x, r, groupEvent(t, true, 1, "", 0, tokens))
	if got := x.Blocks(part, r); got != 0 {
		t.Fatalf("group 1 without a kind: %d entries indexed", got)
	}
	applyPayload(t, x, r, groupEvent(t, true, 0, "", 0, tokens))
	applyPayload(t, x, r, groupEvent(t, true, -1, "", 10, seq(900, 4)))
	if got := x.Blocks(part, r); got != 3 {
		t.Fatalf("group 0 and no group: %d entries, want 3", got)
	}
	// A full-attention store of group 2 after the rank's blocks were
	// cleared is followed from then on.
	applyPayload(t, x, r, ref(t, map[string]any{"ts": 1.0, "events": []any{map[string]any{"type": "AllBlocksCleared"}}}))
	applyPayload(t, x, r, groupEvent(t, true, 2, "mla_attention", 20, tokens))
	if got := heldDepth(x, blocks, 1); got != 2 {
		t.Fatalf("after a clear, group 2's full-attention store: %d blocks indexed, want 2", got)
	}
}

// TestClearForgetsAGroupLearnedFromARefusedStore: a store names the
// rank's full-attention group and is then refused (its parent is one the
// rank does not hold), so the rank holds nothing. A clear (the engine
// restarted) must still forget the group: the restarted engine's groups
// may be numbered otherwise, and its stores were skipped for good.
func TestClearForgetsAGroupLearnedFromARefusedStore(t *testing.T) {
	tokens := seq(500, 8)
	blocks := selection.AppendBlockHashes(nil, tokens, 4, selection.HashOptions{})
	x := New()
	x.ConfigurePartition(part, 4, false)
	r := selectionRank(1)
	orphan := map[string]any{"type": "BlockStored", "block_hashes": []any{7}, "parent_block_hash": 999,
		"token_ids": []any{1, 2, 3, 4}, "block_size": 4, "medium": "GPU", "group_idx": 1, "kv_cache_spec_kind": "full_attention"}
	_ = x.Apply(part, r, &decodeOne(t, ref(t, map[string]any{"ts": 1.0, "events": []any{orphan}})).Events[0])
	if got := x.Blocks(part, r); got != 0 {
		t.Fatalf("the orphan store was indexed: %d entries", got)
	}
	applyPayload(t, x, r, ref(t, map[string]any{"ts": 1.0, "events": []any{map[string]any{"type": "AllBlocksCleared"}}}))
	applyPayload(t, x, r, groupEvent(t, true, 0, "full_attention", 0, tokens))
	if got := heldDepth(x, blocks, 1); got != 2 {
		t.Fatalf("after the clear, the full-attention group 0's store: %d blocks indexed, want 2", got)
	}
}
