package indexer

import (
	"fmt"

	"github.com/kvrouter/caddy-kvrouter/selection"
)

// LoadDump applies dumped events (ours or a peer's) to partition p, which
// must be configured; the tests use it to show that a dump rebuilds the
// same index. Events carry our local hashes, so no tokens are needed.
func (x *Index) LoadDump(p selection.PartitionKey, events []selection.RouterEvent) error {
	t := x.tree(p)
	if t == nil {
		return fmt.Errorf("partition %s is not configured", p)
	}
	t.mu.Lock()
	defer x.evictOver() // runs after the unlock below
	defer t.mu.Unlock()
	for _, ev := range events {
		r := selection.Rank{WorkerID: ev.WorkerID, DPRank: ev.Event.DPRank}
		tier := Device
		for i, name := range tierNames {
			if name == ev.StorageTier {
				tier = Tier(i)
			}
		}
		m := t.ranks[r]
		if m == nil {
			m = newTable[entry](0)
			t.ranks[r] = m
		}
		id := t.rankID(r)
		st := ev.Event.Data.Stored
		var key uint64
		have := false
		if st.ParentHash != nil {
			e, ok := m.get(*st.ParentHash)
			if !ok {
				x.counters.unknownParent.add(1)
				continue
			}
			key, have = e.key, true
		}
		for _, b := range st.Blocks {
			var n *node
			key, n = t.extend(key, have, b.TokensHash)
			have = true
			t.hold(x, m, id, []*node{n}, key, b.BlockHash, tier)
		}
	}
	return nil
}
