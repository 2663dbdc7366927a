package indexer

import "github.com/kvrouter/caddy-kvrouter/selection"

// A model whose layers are not all full attention (sliding-window or
// Mamba layers beside it: gpt-oss, Gemma 3, Qwen3-Next) has several
// KV-cache groups, and vLLM with its hybrid cache manager publishes each
// group's stores and removals as events of their own, tagged group_idx
// (and, on stores, kv_cache_spec_kind). The groups are numbered by their
// first layer, so the full-attention group is often not group 0: group 0
// is sliding window for gpt-oss and Gemma 3, Mamba for Qwen3-Next.
//
// The index follows one full-attention group a rank: the first that a
// store names with a full-attention kind, whatever its number. Stores of
// other kinds are skipped where they are read (readSpecKind); stores of a
// second full-attention group (the same blocks again) and removals of
// any group but the followed one are skipped here. Until a rank's stores
// have named a kind, its group 0 is followed, as in releases whose events
// named no kinds (every event then was of group 0). The choice is the
// rank's until its blocks are cleared.

// follows reports whether the index follows ev's group for rank r,
// learning the rank's group from a full-attention store. The write lock
// is held.
func (t *tree) follows(r selection.Rank, ev *Event) bool {
	id := t.rankID(r)
	followed := t.groups[id] - 1 // -1: not yet known
	if followed < 0 && ev.Kind == Stored && ev.FullKind && ev.Group >= 0 && ev.Group < 1<<31 {
		t.groups[id] = ev.Group + 1
		return true
	}
	if followed < 0 {
		return ev.Group == 0
	}
	return ev.Group == followed
}
